#!/bin/bash
# /tmp/bck_base (f8b8c5e), /tmp/bck_fin (9c663a5): bench_core of each commit. Run in its own autogroup.
# Q6_K tg128 (and Q4_K_M) re-checked with the order reversed (fin before base), 3 rounds.
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape
date -u; uptime
for r in 1 2 3; do for f in q6_k q4_k_m; do for b in fin base; do
echo "$r $f $b $(/tmp/bck_$b $D/qwen3-0.6b-shape-$f.gguf --threads 2 --reps 3 --pp 64 --tg 128 2>/dev/null | grep -E '"tg128"' | sed 's/.*median": \([0-9.]*\), "tokens_per_s_min": \([0-9.]*\), "tokens_per_s_max": \([0-9.]*\).*/tg128 \1 (\2-\3)/')"
done; done; done
