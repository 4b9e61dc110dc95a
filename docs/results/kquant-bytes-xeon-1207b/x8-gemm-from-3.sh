#!/bin/bash
# The x8 GEMM from 3 activation rows (/tmp/mb_x8g3) against from 4 (/tmp/mb_x8, the decode tile at 3),
# at 3 rows, Gemma 3 layer, one thread, 3 rounds. Run in its own autogroup.
for isa in native avx2; do if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi; for f in q5_kx8 q4_kx8; do line="$isa $f m=3"; for r in 1 2 3; do for b in x8 x8g3; do line="$line $b $(/tmp/mb_$b 3 1 500 $f | grep layer | sed "s/.*best \([0-9.]*\) ms.*/\1/")"; done; done; echo "$line"; done; done
