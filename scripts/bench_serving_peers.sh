#!/bin/bash
# The serving workload (512-token prompts, 128 tokens out, 1, 8 and 32 concurrent streams)
# against Vigil, vLLM's CPU build and llama.cpp's llama-server, side by side in one run, each
# peer at its best settings for serving: llama-server with 8 parallel slots and flash attention
# off (its best for decode batches), vLLM with float32 weights and KV on both cores. Every
# target serves SmolLM2-135M: Vigil the Q4_1 file, llama-server its Q4_0 copy (its fastest x86
# path), vLLM the float32 dequantization of the Q4_1 file (make_hf_from_gguf.py; vLLM's CPU build
# has no 4-bit GGUF path). Writes the bench's result file and load.txt into OUT_DIR.
# Usage: LLAMACPP_BIN=... scripts/bench_serving_peers.sh OUT_DIR [Q4_0_GGUF] [CONCURRENCY]
#   (after eval "$(scripts/setup_llamacpp.sh)" and eval "$(scripts/setup_vllm_cpu.sh)")
# WITH_VLLM=0 leaves vLLM out (Vigil and llama-server only: e.g. both capped at AVX2, with
# VIGIL_MAX_ISA=avx2 and an LLAMACPP_MAX_ISA=avx2 build; vLLM's torch has no such cap).
set -u
cd "$(dirname "$0")/.."
L=${LLAMACPP_BIN:?set LLAMACPP_BIN to a native llama.cpp build (scripts/setup_llamacpp.sh)}
O=${1:?usage: bench_serving_peers.sh OUT_DIR [Q4_0_GGUF] [CONCURRENCY]}; mkdir -p "$O"
Q0=${2:-/tmp/smol-q4_0.gguf}
C=${3:-1,8,32}
V=${VIGIL:-target/release/vigil}
HF=${VLLM_HF_DIR:-$HOME/.cache/vigil-peers/smollm2-135m-hf-f32}
"$V" serve --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --port 18701 --threads 2 > "$O/vigil.log" 2>&1 &
vp=$!
"$L/llama-server" -m "$Q0" --port 18702 -t 2 -np 8 -fa off -c 32768 > "$O/llama-server.log" 2>&1 &
lp=$!
ports=(18701 18702)
targets=(--target vigil=http://127.0.0.1:18701 --target llama-server=http://127.0.0.1:18702)
xp=
caches="vigil: on (default); llama-server: -np 8, its prompt cache on (default)"
if [ "${WITH_VLLM:-1}" != 0 ]; then
  scripts/start_vllm_cpu.sh "$HF" 18703 > "$O/vllm.log" 2>&1 &
  xp=$!
  ports+=(18703)
  targets+=(--target vllm-cpu=http://127.0.0.1:18703)
  caches="$caches; vllm-cpu: prefix caching as its default"
fi
# Stop every server and its children (vLLM's engine core) and wait until they are gone, so
# that a benchmark run right after this one does not share the cores with a shutdown.
stop() {
  local all="$vp $lp $xp"
  for p in $vp $lp $xp; do all="$all $(pgrep -P "$p" | tr '\n' ' ')"; done
  kill $all 2>/dev/null
  for _ in $(seq 60); do
    local alive=0
    for p in $all; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 1
  done
  kill -9 $all 2>/dev/null
}
trap stop EXIT
# The CPU, both engines' caps and the host's topology (llama.cpp's folder names its build:
# noamx = -march=native, avx2 = LLAMACPP_MAX_ISA=avx2).
scripts/record_cpu.sh "$O/cpu.txt" "$L"
for port in "${ports[@]}"; do
  for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
done
uptime >> "$O/load.txt"
"$V" bench run --workload concurrent --concurrency "$C" --iterations "${ITERATIONS:-4}" \
  "${targets[@]}" --out "$O" \
  --prefix-cache "$caches" \
  > "$O/bench.log" 2>&1
uptime >> "$O/load.txt"
