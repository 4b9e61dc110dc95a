#!/bin/bash
# VIGIL_AMX=0 (the AVX-512 VNNI GEMM) against the default (AMX for Q8_0), alternated, in this
# shell's autogroup at -19: the Qwen3-0.6B shape's layer at 512 rows, then its Q8_0 pp512.
# Run from the repository root: setsid bash docs/results/amx-q8-xeon-1206i/run.sh
echo -19 > /proc/self/autogroup
B=target/release/examples
for r in 1 2 3; do
  for a in 0 1; do
    echo "round $r VIGIL_AMX=$a matmul_bench 512 2 10 q8_0x8: $(VIGIL_AMX=$a $B/matmul_bench 512 2 10 q8_0x8 2>&1 | tail -1)"
  done
done
for r in 1 2 3; do
  for a in 0 1; do
    echo "round $r VIGIL_AMX=$a bench_core q8_0 pp512: $(VIGIL_AMX=$a $B/bench_core ~/.cache/vigil-peers/qwen3-0.6b-shape/qwen3-0.6b-shape-q8_0.gguf --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | grep pp512)"
  done
done
for r in 1 2; do
  for a in 0 1; do
    echo "round $r VIGIL_AMX=$a bench_core smollm2 q4_0 pp512 (Q4 does not use AMX; its output layer is Q8_0): $(VIGIL_AMX=$a $B/bench_core /tmp/smol-q4_0.gguf --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | grep pp512)"
  done
done
