#!/bin/bash
# Qwen3-0.6B-shape Q5_K_M, Q4_K_M and Q6_K (llama-quantize of the BF16 GGUF) and Gemma 3 270M
# Q4_K_M: before (base = f8b8c5e) and after (fin = 9c663a5: k-quant quants packed as bytes, the
# 4-row rest tile, Q5_K interleaved at load), natively and (Qwen3 shape) held to AVX2,
# alternated, with llama-bench (-fa 1, its faster prefill here) on the same file each round.
# /tmp/bck_base, /tmp/bck_fin: bench_core of each commit; GEMMA: the Gemma 3 270M Q4_K_M GGUF
# (scripts/fetch_test_assets.sh). Run in its own autogroup:
#   setsid bash -c 'echo -19 > /proc/self/autogroup; bash ab.sh'
source /tmp/llamacpp_env.txt
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u; uptime
for r in 1 2 3; do
  for f in q5_k_m q4_k_m q6_k gemma; do
    if [ $f = gemma ]; then Q=$GEMMA; else Q=$D/qwen3-0.6b-shape-$f.gguf; fi
    for b in base fin; do
      echo "== round $r $b $f native"; /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 128 2>/dev/null | grep -E '"(pp512|tg128)"'
      if [ $f != gemma ]; then
        echo "== round $r $b $f avx2"; VIGIL_MAX_ISA=avx2 /tmp/bck_$b $Q --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | grep -E '"pp512"'
      fi
    done
    echo "== round $r llama-bench $f"; $LLAMACPP_BIN/llama-bench -m $Q -t 2 -p 512 -n 128 -r 3 -fa 1 2>/dev/null | grep -E "pp512|tg128"
  done
done
date -u; uptime
