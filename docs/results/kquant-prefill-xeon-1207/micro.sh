#!/bin/bash
# Kernel-level figures behind ab.sh, one thread from L2 unless named (Gemma 3 270M's Q4_K / Q6_K
# shapes: 640 × 1024 and 640 × 2048):
# - the k-quant prefill GEMM at 128 activation rows before (old = adb158c) and after (new),
#   alternated: quantization, packing and the tile together, as a matmul call runs them;
# - Q4_K row-major (q4_k) against interleaved at load (q4_kx8) on the new build, 1 to 128
#   activation rows, natively and held to AVX2;
# - two threads reading 1 GiB of Qwen3-shaped Q4_K matrices from DRAM, rows against interleaved.
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash micro.sh'
# Needs /tmp/mbk_old, /tmp/mbk_new (matmul_bench of each commit), /tmp/gbk_new (gemv_bandwidth).
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for r in 1 2 3; do
  for b in old new; do
    for f in q4_k q6_k; do echo -n "round $r $b $f: "; /tmp/mbk_$b 128 1 30 $f | grep layer; done
  done
done
for isa in avx512 avx2; do
  for r in 1 2; do
    for m in 1 2 4 7 8 128; do
      for f in q4_k q4_kx8; do
        reps=$(( m < 8 ? 1000 : 100 ))
        echo -n "$isa round $r $f m=$m: "; VIGIL_MAX_ISA=$isa /tmp/mbk_new $m 1 $reps $f | grep layer
      done
    done
  done
done
for r in 1 2 3; do
  for f in q4_k q4_kx8; do echo -n "DRAM round $r $f: "; /tmp/gbk_new $f 2 1024 5 | tail -1; done
done
date -u; uptime
