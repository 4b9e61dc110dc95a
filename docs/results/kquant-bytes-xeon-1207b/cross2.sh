#!/bin/bash
# The same with the 4-row rest tile (/tmp/mb_kb4) against without (/tmp/mb_kb), both layouts, and
# the Q4_0 / Q8_0 GEMMs the driver also runs, at row counts that leave a rest.
for f in q4_kx8 q5_k q4_0x8 q8_0x8; do for m in 12 13 20 28; do
reps=$(( m < 16 ? 500 : 100 ))
for v in "/tmp/mb_kb 100000" "/tmp/mb_kb4 100000" "/tmp/mb_kb4 1"; do set -- $v
r=$(VIGIL_KB_MIN=$2 $1 $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/'); r2=$(VIGIL_KB_MIN=$2 $1 $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')
echo -n "$f m=$m $(basename $1)/$2: $r $r2 | "
done; echo; done; done
