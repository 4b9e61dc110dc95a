#!/bin/bash
# gemm_driver ROW_CHUNK 256 (/tmp/bck_rc256, not kept) against 128 (/tmp/bck_new = 5b74e1e),
# Qwen3-shape pp512, 2 threads, 2 rounds. Run in its own autogroup.
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape
for r in 1 2; do for f in q5_k_m q4_k_m q8_0; do for b in new rc256; do
echo "$r $f $b $(/tmp/bck_$b $D/qwen3-0.6b-shape-$f.gguf --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | grep -E '"pp512"' | sed 's/.*median": \([0-9.]*\), "tokens_per_s_min": \([0-9.]*\), "tokens_per_s_max": \([0-9.]*\).*/\1 (\2-\3)/')"
done; done; done
