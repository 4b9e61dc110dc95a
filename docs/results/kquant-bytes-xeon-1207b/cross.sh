#!/bin/bash
# Gemma 3 270M k-quant shapes, one thread: Q4_K/Q5_K quants packed as stored (nibbles) against
# bytes at each row count. /tmp/mb_kb = matmul_bench of the change with a temporary VIGIL_KB_MIN
# override of the bytes threshold (100000: always as stored; 1: always bytes), before the
# 4-row rest tile. Run in its own autogroup: setsid bash -c "echo -19 > /proc/self/autogroup; bash cross.sh"
for isa in native avx2; do for f in q4_kx8 q4_k q5_k; do for m in 4 8 12 16 24 32 64; do
reps=$(( m < 16 ? 500 : 100 ))
if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi
a=$(VIGIL_KB_MIN=100000 /tmp/mb_kb $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')
b=$(VIGIL_KB_MIN=1 /tmp/mb_kb $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')
a2=$(VIGIL_KB_MIN=100000 /tmp/mb_kb $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')
b2=$(VIGIL_KB_MIN=1 /tmp/mb_kb $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')
echo "$isa $f m=$m nibbles $a $a2 bytes $b $b2"
done; done; done
