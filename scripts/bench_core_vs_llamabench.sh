#!/bin/bash
# Vigil (bench_core) against llama-bench (native build), interleaved, 2 rounds: SmolLM2 Q4_0
# (Vigil at its best ISA and capped at AVX2; llama-bench with flash attention on and off) and
# Gemma 3 270M Q4_K_M (llama-bench defaults). Writes JSON per run into OUT_DIR. "avx512" names the best level the CPU has.
# Usage: LLAMACPP_BIN=... scripts/bench_core_vs_llamabench.sh OUT_DIR [Q4_0_GGUF]
# (a Q4_0 copy: llama-quantize --allow-requantize .cache/SmolLM2-135M-Instruct.Q4_1.gguf Q4_0.gguf Q4_0)
set -u
cd "$(dirname "$0")/.."
L=${LLAMACPP_BIN:?set LLAMACPP_BIN to a native llama.cpp build (scripts/setup_llamacpp.sh)}
cargo build -q --release -p vigil-engine --example bench_core
B=target/release/examples/bench_core
O=${1:?usage: bench_core_vs_llamabench.sh OUT_DIR [Q4_0_GGUF]}; mkdir -p $O
G=.cache/gemma-3-270m-q4_k_m.gguf
Q=${2:-/tmp/smol-q4_0.gguf}
for r in 1 2; do
  uptime >> $O/load.txt
  $B $Q --threads 2 --reps 5 > $O/vigil-q4_0-avx512-$r.jsonl 2>&1
  VIGIL_MAX_ISA=avx2 $B $Q --threads 2 --reps 5 > $O/vigil-q4_0-avx2-$r.jsonl 2>&1
  $L/llama-bench -m $Q -t 2 -p 512,2048 -n 128 -r 5 -fa 1 -o json > $O/llama-q4_0-fa1-$r.json 2>$O/llama-q4_0-fa1-$r.err
  $L/llama-bench -m $Q -t 2 -p 512,2048 -n 128 -r 5 -fa 0 -o json > $O/llama-q4_0-fa0-$r.json 2>$O/llama-q4_0-fa0-$r.err
  $B $G --threads 2 --reps 5 --pp 512 > $O/vigil-gemma-$r.jsonl 2>&1
  $L/llama-bench -m $G -t 2 -p 512 -n 128 -r 5 -o json > $O/llama-gemma-$r.json 2>$O/llama-gemma-$r.err
  uptime >> $O/load.txt
done
echo done > $O/DONE
