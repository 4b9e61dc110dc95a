#!/usr/bin/env bash
# Peak resident memory (VmHWM) of `vigil serve` and llama-cpp-python's server while serving
# STREAMS concurrent streams at CTX context (prompt CTX-128, 128 output tokens), in one run.
# Vigil runs the streams at once; llama-cpp-python has one slot, so it gets n_ctx = STREAMS × CTX
# (the KV that 8 slots of llama.cpp's own server would hold: `llama-server -c 16384 -np 8`) and
# one request of the same shape, which touches its whole preallocated KV cache either way.
# Usage: PYTHON=python-with-llama-cpp-python scripts/bench_memory.sh [GGUF] [STREAMS] [CTX]
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=${1:-.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
streams=${2:-8}
ctx=${3:-2048}
python=${PYTHON:-python3}
vigil=${VIGIL:-target/release/vigil}
prompt=$((ctx - 128))
out=$(mktemp -d)
hwm() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

"$vigil" serve --model "$gguf" --port 18441 --threads 2 2>"$out/vigil.log" &
vpid=$!
trap 'kill $vpid 2>/dev/null || true' EXIT
"$vigil" bench run --target vigil=http://127.0.0.1:18441 --workload concurrent \
  --concurrency "$streams" --concurrent-prompt-tokens $prompt --concurrent-output-tokens 128 \
  --warmup 0 --iterations "$streams" --out "$out" >/dev/null 2>"$out/bench.log"
vigil_kib=$(hwm $vpid)
kill $vpid

"$python" -m llama_cpp.server --model "$gguf" --host 127.0.0.1 --port 18442 \
  --n_ctx $((streams * ctx)) --n_threads 2 --n_threads_batch 2 --flash_attn True \
  --verbose False 2>"$out/llamacpp.log" &
lpid=$!
trap 'kill $lpid 2>/dev/null || true' EXIT
"$vigil" bench run --target llama.cpp=http://127.0.0.1:18442 --workload single \
  --prompt-tokens $prompt --output-tokens 128 --warmup 0 --iterations 1 --out "$out" \
  >/dev/null 2>>"$out/bench.log"
llama_kib=$(hwm $lpid)
kill $lpid
llama_version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
printf '{"streams": %d, "ctx": %d, "vigil_peak_rss_mib": %.1f, "llamacpp_peak_rss_mib": %.1f, "ratio": %.3f, "llama_cpp_python": "%s", "model": "%s", "date": "%s"}\n' \
  "$streams" "$ctx" "$(echo "$vigil_kib / 1024" | bc -l)" "$(echo "$llama_kib / 1024" | bc -l)" \
  "$(echo "$vigil_kib / $llama_kib" | bc -l)" "$llama_version" "$(basename "$gguf")" "$(date -u +%FT%TZ)"
