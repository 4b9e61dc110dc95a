#!/usr/bin/env bash
# The runs behind docs/benchmarks.md's "Where a BF16 decode step's time goes" (2026-12-06 late
# morning, Intel Xeon, on e432cc2). OUT defaults to this folder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
O=${1:-docs/results/qwen3-shape-xeon-1206d}
HF=${DIR:-$HOME/.cache/vigil-peers/qwen3-0.6b-shape}/hf
# Both engines, two interleaved rounds (LLAMACPP_BIN: scripts/setup_llamacpp.sh; PYTHON with gguf).
scripts/bench_qwen3_shape.sh "$O"
# Where a step's time goes, BF16 and Q8_0 (a separate run: the probe stays out of the figures above).
B=target/release/examples
"$B/bench_core" "$HF" --threads 2 --reps 3 --pp 512 --tg 128 --breakdown > "$O/breakdown-bf16.jsonl"
"$B/bench_core" "$HF" --threads 2 --reps 3 --pp 512 --tg 128 --quantize q8_0 --breakdown > "$O/breakdown-q8_0.jsonl"
