#!/bin/bash
# Every CPU-speed bar in one run: the SmolLM2 kernels against llama-bench, serving against
# llama-server and vLLM's CPU build, the Qwen3-0.6B shape against llama-bench, one after another
# on the same build, then scripts/check_cpu_bars.py's table of each bar, its figure per round and
# whether it holds. About 45 minutes on 2 cores; run it in its own autogroup at high priority:
#   setsid bash -c 'echo -19 > /proc/self/autogroup; scripts/bench_cpu_bars.sh OUT'
# Usage: scripts/bench_cpu_bars.sh OUT_DIR
#   OUT_DIR/{core,serving,qwen3} hold each benchmark's raw files, OUT_DIR/bars.md the table.
# Env: LLAMACPP_BIN and VLLM_PYTHON (eval "$(scripts/setup_llamacpp.sh)" and
#      eval "$(scripts/setup_vllm_cpu.sh)"); WITH_VLLM=0 leaves vLLM out; VIGIL_MAX_ISA and an
#      LLAMACPP_MAX_ISA=avx2 build hold both engines to AVX2; Q4_0 (the SmolLM2 Q4_0 copy, made
#      with llama-quantize when missing; default /tmp/smol-q4_0.gguf); PYTHON (gguf and numpy,
#      for the Qwen3 shape's floors; default VLLM_PYTHON, checked before anything runs).
set -eu
cd "$(dirname "$0")/.."
L=${LLAMACPP_BIN:?set LLAMACPP_BIN to a native llama.cpp build (scripts/setup_llamacpp.sh)}
O=${1:?usage: bench_cpu_bars.sh OUT_DIR}; mkdir -p "$O"
Q0=${Q4_0:-/tmp/smol-q4_0.gguf}
if [ ! -f "$Q0" ]; then
  "$L/llama-quantize" --allow-requantize .cache/SmolLM2-135M-Instruct.Q4_1.gguf "$Q0" Q4_0 > "$O/quantize.log" 2>&1
fi
# The Qwen3 shape's floors need a Python with gguf and numpy: fail now, not 30 minutes in.
export PYTHON=${PYTHON:-${VLLM_PYTHON:-python3}}
CHECK_ONLY=1 scripts/bench_qwen3_shape.sh "$O/qwen3"
cargo build -q --release --bin vigil
git rev-parse HEAD > "$O/commit.txt"
scripts/bench_decode_vs_llamabench.sh "$O/core" "$Q0"
python3 scripts/summarize_decode_bench.py "$O/core" "$Q0" > "$O/core/summary.md"
scripts/bench_serving_peers.sh "$O/serving" "$Q0"
scripts/bench_qwen3_shape.sh "$O/qwen3"
python3 scripts/check_cpu_bars.py --core "$O/core" --serving "$O/serving" --qwen3 "$O/qwen3" --q4_0 "$Q0" > "$O/bars.md"
cat "$O/bars.md"
