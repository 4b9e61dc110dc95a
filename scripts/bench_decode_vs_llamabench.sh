#!/bin/bash
# Vigil (bench_core) against llama-bench (native build) on SmolLM2-135M in Q4_0 and Q4_1,
# interleaved, 2 rounds, 2 threads, with the decode floors of the same run: prefill pp512 and
# pp2048 (llama.cpp with flash attention on, its best for prefill), decode tg128, and decode of
# 64 tokens after 2,048 (llama.cpp with flash attention off and on: off was its best at depth),
# plus the read bandwidth (mem_bandwidth, 2 threads, 1 GiB) the floors divide by: at each round's
# start, and just before and after each Vigil run (the floors take the mean of those two); and
# bench_core's `tg128-floor`, decode alternated token by token with a plain read of the bytes it
# reads (its share of what memory gives right then, in the same process). Writes one
# file per run into OUT_DIR, and load.txt (uptime before and after each round).
# Usage: LLAMACPP_BIN=... scripts/bench_decode_vs_llamabench.sh OUT_DIR [Q4_0_GGUF]
# (VIGIL_MAX_ISA=avx2 with an LLAMACPP_MAX_ISA=avx2 build times both engines' AVX2 paths.)
# (a Q4_0 copy: llama-quantize --allow-requantize .cache/SmolLM2-135M-Instruct.Q4_1.gguf Q4_0.gguf Q4_0)
set -u
cd "$(dirname "$0")/.."
L=${LLAMACPP_BIN:?set LLAMACPP_BIN to a native llama.cpp build (scripts/setup_llamacpp.sh)}
cargo build -q --release -p vigil-engine --example bench_core --example mem_bandwidth
B=target/release/examples
O=${1:?usage: bench_decode_vs_llamabench.sh OUT_DIR [Q4_0_GGUF]}; mkdir -p "$O"
Q0=${2:-/tmp/smol-q4_0.gguf}
Q1=.cache/SmolLM2-135M-Instruct.Q4_1.gguf
# The CPU, both engines' caps and the host's topology (llama.cpp's folder names its build:
# noamx = -march=native, avx2 = LLAMACPP_MAX_ISA=avx2).
scripts/record_cpu.sh "$O/cpu.txt" "$L"
for r in 1 2; do
  uptime >> "$O/load.txt"
  $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 > "$O/bandwidth-$r.json"
  # The bandwidth just before and just after each Vigil run: its floors take their mean (the
  # round's reading is Q4_0's "before").
  cp "$O/bandwidth-$r.json" "$O/bandwidth-$r-q4_0-before.json"
  for f in q4_0 q4_1; do
    m=$Q0; [ $f = q4_1 ] && m=$Q1
    [ $f = q4_1 ] && $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 > "$O/bandwidth-$r-$f-before.json"
    $B/bench_core "$m" --threads 2 --reps 5 --pp 512,2048 --depth 2048 --floor > "$O/vigil-$f-$r.jsonl" 2>&1
    $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 > "$O/bandwidth-$r-$f-after.json"
    $L/llama-bench -m "$m" -t 2 -p 512,2048 -n 128 -r 5 -fa 1 -o json > "$O/llama-$f-fa1-$r.json" 2> "$O/llama-$f-fa1-$r.err"
    for fa in 0 1; do
      $L/llama-bench -m "$m" -t 2 -p 0 -n 64 -d 2048 -r 5 -fa $fa -o json > "$O/llama-$f-d2048-fa$fa-$r.json" 2> "$O/llama-$f-d2048-fa$fa-$r.err"
    done
  done
  uptime >> "$O/load.txt"
done
echo done > "$O/DONE"
