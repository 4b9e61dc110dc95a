#!/bin/bash
# Decode from DRAM in small matrices on a host whose L3 holds SmolLM2 (2026-12-06 midday).
# Needs LLAMACPP_BIN (scripts/setup_llamacpp.sh), VLLM_PYTHON (gguf), the SmolLM2 Q4_0 file
# made by llama-quantize from the test model (as scripts/bench_cpu_bars.sh makes it).
set -eu
O=${O:-docs/results/deep-xeon-1206e}
SMOL=${SMOL:-/tmp/smol-q4_0.gguf}
DEEP=${DEEP:-/tmp/smol-deep-q4_0.gguf}
[ -f "$DEEP" ] || "$VLLM_PYTHON" scripts/make_deep_gguf.py "$SMOL" "$DEEP" 17
B=target/release/examples
for r in 1 2; do
    "$LLAMACPP_BIN/llama-bench" -m "$DEEP" -t 2 -p 0 -n 64 -r 3 -o jsonl 2> /dev/null | grep -v '^#'
    "$B/bench_core" "$DEEP" --threads 2 --reps 3 --pp 16 --tg 64 --floor --breakdown 2> /dev/null | grep tg64
done > "$O/deep-tg64.jsonl"
for isa in avx512 avx2; do for sh in qwen3 smollm2; do for f in q4_0x8 q4_1x8 q8_0x8 bf16x8; do
    echo -n "$isa $sh "; VIGIL_MAX_ISA=$isa "$B/gemv_bandwidth" $f 2 2048 3 $sh
done; done; done > "$O/gemv-from-dram.txt"
