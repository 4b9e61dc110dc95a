#!/bin/bash
# Row-major Q4_K / Q6_K from 2 to 16 activation rows (batched decode, a speculative step's
# verification): the row tiles up to the old GEMM thresholds (old = 11e1897: the GEMM from 8
# rows for Q4_K, 16 for Q6_K) against the GEMM from 3 rows (new), now that its packing runs in
# registers. One thread, Gemma 3 270M's Q4_K / Q6_K shapes, natively and held to AVX2.
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash gemm-from-3.sh'
# Needs /tmp/mbk_new (matmul_bench of 11e1897) and /tmp/mbk_new2 (of the change).
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for isa in avx512 avx2; do
  for r in 1 2; do
    for f in q4_k q6_k; do
      for m in 2 3 4 8 12 16; do
        for b in new new2; do
          echo -n "$isa round $r $f m=$m $([ $b = new ] && echo old || echo new): "
          VIGIL_MAX_ISA=$isa /tmp/mbk_$b $m 1 500 $f | grep layer
        done
      done
    done
  done
done
date -u; uptime
