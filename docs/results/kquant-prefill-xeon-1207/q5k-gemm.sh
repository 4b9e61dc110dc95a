#!/bin/bash
# Q5_K's first GEMM (`avx512_kgemm::Q5K16`, `avx2_kgemm::Q5K8`: Q4_K's tiles with the fifth bit
# or-ed in) against the row tiles Q5_K took before at every row count (`avx2_k_decode` below 4
# activation rows, `avx2_k`'s row tile from 4), one thread, Gemma 3 270M's k-quant shapes,
# natively and held to AVX2. Both binaries are the change's matmul_bench: /tmp/mb_q5rows with
# the GEMM threshold set out of reach, /tmp/mb_q5gemm with the GEMM from 3 rows (committed: from
# 4, where it wins on both levels).
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash q5k-gemm.sh'
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for isa in avx512 avx2; do
  for r in 1 2; do
    for m in 2 3 4 8 16 128; do
      for b in rows gemm; do
        reps=$(( m < 16 ? 500 : 50 ))
        echo -n "$isa round $r q5_k m=$m $b: "; VIGIL_MAX_ISA=$isa /tmp/mb_q5$b $m 1 $reps q5_k | grep layer
      done
    done
  done
done
date -u; uptime
