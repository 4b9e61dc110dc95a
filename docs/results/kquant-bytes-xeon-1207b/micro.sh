#!/bin/bash
# Before (/tmp/mb_base: matmul_bench of f8b8c5e) and after (/tmp/mb_new: this change), one
# thread, per Gemma 3 layer, natively (AVX-512) and held to AVX2, 2 rounds alternated.
grep -m1 "model name" /proc/cpuinfo; date -u; uptime
for isa in native avx2; do for f in q4_kx8 q4_k q5_k q6_k; do for m in 3 4 8 12 128; do
reps=$(( m < 16 ? 500 : 50 ))
if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi
line="$isa $f m=$m"
for r in 1 2; do for b in base new; do line="$line $b $(/tmp/mb_$b $m 1 $reps $f | grep layer | sed 's/.*best \([0-9.]*\) ms.*/\1/')"; done; done
echo "$line"
done; done; done
