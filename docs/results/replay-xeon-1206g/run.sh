#!/bin/bash
# A decode step against its matmuls replayed alone and a plain read of the same bytes
# (bench_core --floor: tgN, tgN-floor, tgN-matmuls), 2026-12-06 evening. Needs the SmolLM2
# Q4_0 file and its deep copy (scripts/make_deep_gguf.py, see ../deep-xeon-1206e/run.sh) and
# the Qwen3-0.6B-shape files (scripts/bench_qwen3_shape.sh).
set -eu
O=${O:-docs/results/replay-xeon-1206g}
SMOL=${SMOL:-/tmp/smol-q4_0.gguf}
DEEP=${DEEP:-/tmp/smol-deep-q4_0.gguf}
Q3=${Q3:-$HOME/.cache/vigil-peers/qwen3-0.6b-shape}
B=target/release/examples/bench_core
{ grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo; uptime; } > "$O/cpu.txt"
for r in 1 2; do
    for run in "deep 2 64 $DEEP" "deep 1 16 $DEEP" "smollm2 2 128 $SMOL" \
        "qwen3-bf16 2 32 $Q3/qwen3-0.6b-shape-bf16.gguf" "qwen3-q8_0 2 32 $Q3/qwen3-0.6b-shape-q8_0.gguf"; do
        set -- $run
        echo "# round $r $1 threads $2 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
        "$B" "$4" --threads "$2" --reps 3 --pp 16 --tg "$3" --floor 2>&1 | grep -E '"tg|mapped'
    done
done > "$O/replay.jsonl"
