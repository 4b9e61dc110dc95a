#!/bin/bash
# Q4_K_M before (old = adb158c) and after (new) this morning's k-quant work (the GEMM's scale
# step as vpshufb + one vpdpwssd, the packing in AVX2 registers, Q8_K quantization vectorized,
# the mins/offset chains interleaved, Q4_K interleaved at load), alternated, with llama-bench on
# the same files: the Qwen3-0.6B-shape Q4_K_M GGUF (llama-quantize from the BF16 one; Q4_K, with
# Q6_K for the output head, attn_v and half of ffn_down) natively and held to AVX2 (the path an
# AVX2-only CPU takes), and Gemma 3 270M Q4_K_M (the real model).
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash ab.sh'
# Needs /tmp/bck_old, /tmp/bck_new (bench_core of each commit), LLAMACPP_BIN.
Q=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/qwen3-0.6b-shape-q4_k_m.gguf
G=${GEMMA:-.cache/gemma-3-270m-q4_k_m.gguf}
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for r in 1 2 3; do
  for b in old new; do
    echo "== round $r $b qwen3-q4_k_m native"; /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 128 --floor 2>/dev/null | grep -v breakdown
    echo "== round $r $b qwen3-q4_k_m avx2"; VIGIL_MAX_ISA=avx2 /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 128 2>/dev/null | grep -E '"(pp512|tg128)"'
    echo "== round $r $b gemma3 native"; /tmp/bck_$b $G --threads 2 --reps 3 --pp 512 --tg 128 2>/dev/null | grep -E '"(pp512|tg128)"'
  done
  echo "== round $r llama-bench qwen3-q4_k_m"; $LLAMACPP_BIN/llama-bench -m $Q -t 2 -p 512 -n 128 -r 3 -fa 0,1 2>/dev/null | grep -E "pp512|tg128"
  echo "== round $r llama-bench gemma3"; $LLAMACPP_BIN/llama-bench -m $G -t 2 -p 512 -n 128 -r 3 -fa 0,1 2>/dev/null | grep -E "pp512|tg128"
done
date -u; uptime
