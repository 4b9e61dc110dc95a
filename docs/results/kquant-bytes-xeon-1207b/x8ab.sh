#!/bin/bash
# Qwen3-0.6B-shape Q5_K_M, Q5_K row-major (/tmp/bck_new: bench_core of 5b74e1e) against interleaved
# at load (/tmp/bck_x8: the change, x8 GEMM from 4 rows), 3 rounds alternated, 2 threads.
# Run in its own autogroup: setsid bash -c "echo -19 > /proc/self/autogroup; bash x8ab.sh"
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape
for r in 1 2 3; do for b in new x8; do
echo "$r $b $(/tmp/bck_$b $D/qwen3-0.6b-shape-q5_k_m.gguf --threads 2 --reps 3 --pp 512 --tg 128 2>/dev/null | grep -E '"(pp512|tg128)"' | sed 's/.*"test": "\([a-z0-9]*\)".*median": \([0-9.]*\), "tokens_per_s_min": \([0-9.]*\), "tokens_per_s_max": \([0-9.]*\).*/\1 \2 (\3-\4)/' | tr '\n' ' ')"
done; done
