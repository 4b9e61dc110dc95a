#!/bin/bash
# The hot loops of three prefill workloads held to AVX2, profiled on this Xeon and modelled on
# Zen 3 and Sapphire Rapids (`scripts/model_hot_loops.py`, llvm-mca 19). Run from the repo root
# in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash THIS OUT'.
set -euo pipefail
out=${1:?out dir}
mkdir -p "$out"
B=target/release/examples
HF=${HF:-$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf}
Q40=${Q40:-/tmp/smol-q4_0.gguf}
export VIGIL_MAX_ISA=avx2
scripts/record_cpu.sh "$out/cpu.txt"
perf record -q -F 4000 -o "$out/attn.data" -- $B/attention_bench 2048 1 4 > "$out/attn.txt"
perf record -q -F 2000 -o "$out/q4_0.data" -- $B/bench_core "$Q40" --threads 2 --reps 3 --pp 2048 --tg 0 > "$out/q4_0.txt"
perf record -q -F 2000 -o "$out/bf16.data" -- $B/bench_core "$HF" --threads 2 --reps 3 --pp 512 --tg 0 > "$out/bf16.txt"
$B/fma_peak 1 > "$out/fma_peak.txt"
for w in attn q4_0 bf16; do
  bin=$B/attention_bench; [ "$w" = attn ] || bin=$B/bench_core
  echo "== $w: $(tail -1 "$out/$w.txt")"
  python3 scripts/model_hot_loops.py "$out/$w.data" "$bin" --top 5
done > "$out/model.txt"
rm -f "$out"/*.data
