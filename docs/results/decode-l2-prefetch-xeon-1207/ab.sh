#!/bin/bash
# Decode before (old = 979a551) and after (new) the L2 prefetch in the BF16 and Q4 interleaved
# decode tiles, alternated: Qwen3-shape BF16 natively and held to AVX2, SmolLM2 Q4_0 natively.
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash ab.sh'
HF=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; date -u
for r in 1 2 3; do
  for b in old new; do
    echo "== round $r $b bf16 native"; /tmp/bc_$b $HF --threads 2 --reps 3 --pp 16 --tg 128 2>/dev/null | grep tg128
    echo "== round $r $b bf16 avx2"; VIGIL_MAX_ISA=avx2 /tmp/bc_$b $HF --threads 2 --reps 3 --pp 16 --tg 128 2>/dev/null | grep tg128
    echo "== round $r $b q4_0 native"; /tmp/bc_$b /tmp/smol-q4_0.gguf --threads 2 --reps 5 --pp 16 --tg 128 2>/dev/null | grep tg128
  done
done
date -u
