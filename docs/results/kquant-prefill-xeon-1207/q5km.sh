#!/bin/bash
# A Q5_K_M file (llama-quantize of the Qwen3-0.6B-shape BF16 GGUF: Q5_K for most matrices,
# Q6_K for the output head and part of attn_v / ffn_down) before (old = adb158c) and after
# (new = 92aeb74: Q5_K's GEMM, the Q6_K GEMM from 3 rows, the k-quant work above), alternated,
# with llama-bench on the same file in each round.
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash q5km.sh'
# Needs /tmp/bck_old, /tmp/bck_q5 (bench_core of each commit), LLAMACPP_BIN.
Q=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/qwen3-0.6b-shape-q5_k_m.gguf
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for r in 1 2; do
  for b in old q5; do
    echo "== round $r $b qwen3-q5_k_m native"; /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 128 --floor 2>/dev/null | grep -E '"(pp512|tg128|tg128-floor)"'
    echo "== round $r $b qwen3-q5_k_m avx2"; VIGIL_MAX_ISA=avx2 /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | grep -E '"pp512"'
  done
  echo "== round $r llama-bench qwen3-q5_k_m"; $LLAMACPP_BIN/llama-bench -m $Q -t 2 -p 512 -n 128 -r 3 -fa 0,1 2>/dev/null | grep -E "pp512|tg128"
done
date -u; uptime
