#!/usr/bin/env bash
# Peak resident memory (VmHWM) of `vigil serve` and llama-cpp-python's server while serving
# STREAMS concurrent streams at CTX context (prompt CTX-128, 128 output tokens), in one run.
# Vigil runs the streams at once, twice: with its default KV pool (10% of RAM, at most 2 GiB)
# and with `--kv-memory` sized to STREAMS × CTX tokens. llama-cpp-python has one slot, so it gets
# n_ctx = STREAMS × CTX (the KV that 8 slots of llama.cpp's own server would hold: `llama-server
# -c 16384 -np 8`) and one request of the same shape.
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

# f16 K and V of STREAMS × CTX tokens, from the GGUF's shape.
kv_mib=$("$python" - "$gguf" $((streams * ctx)) <<'PY'
import sys, gguf
fields = gguf.GGUFReader(sys.argv[1]).fields
def val(suffix):
    f = next(f for k, f in fields.items() if k.endswith(suffix))
    return int(f.parts[f.data[0]][0])
head_dim = val(".embedding_length") // val(".attention.head_count")
per_token = val(".block_count") * 2 * val(".attention.head_count_kv") * head_dim * 2
print(-(-per_token * int(sys.argv[2]) // (1 << 20)))
PY
)

# Peak RSS of `vigil serve` ARGS... serving STREAMS streams at once (2 × STREAMS requests).
vigil_peak() {
  "$vigil" serve --model "$gguf" --port 18441 --threads 2 "$@" >>"$out/vigil.log" 2>&1 &
  local vpid=$!
  "$vigil" bench run --target vigil=http://127.0.0.1:18441 --workload concurrent \
    --concurrency "$streams" --concurrent-prompt-tokens $prompt --concurrent-output-tokens 128 \
    --warmup 0 --iterations "$streams" --out "$out" >/dev/null 2>>"$out/bench.log"
  hwm $vpid
  kill $vpid
  wait $vpid 2>/dev/null || true
}
vigil_default_kib=$(vigil_peak)
vigil_kib=$(vigil_peak --kv-memory "${kv_mib}MiB")

"$python" -m llama_cpp.server --model "$gguf" --host 127.0.0.1 --port 18442 \
  --n_ctx $((streams * ctx)) --n_threads 2 --n_threads_batch 2 --flash_attn True \
  --verbose False >"$out/llamacpp.log" 2>&1 &
lpid=$!
trap 'kill $lpid 2>/dev/null || true' EXIT
"$vigil" bench run --target llama.cpp=http://127.0.0.1:18442 --workload single \
  --prompt-tokens $prompt --output-tokens 128 --warmup 0 --iterations 1 --out "$out" \
  >/dev/null 2>>"$out/bench.log"
llama_kib=$(hwm $lpid)
kill $lpid
llama_version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
mib() { echo "$1 / 1024" | bc -l; }
printf '{"streams": %d, "ctx": %d, "vigil_kv_memory_mib": %d, "vigil_peak_rss_mib": %.1f, "vigil_default_kv_peak_rss_mib": %.1f, "llamacpp_n_ctx": %d, "llamacpp_peak_rss_mib": %.1f, "ratio": %.3f, "llama_cpp_python": "%s", "model": "%s", "date": "%s"}\n' \
  "$streams" "$ctx" "$kv_mib" "$(mib "$vigil_kib")" "$(mib "$vigil_default_kib")" \
  $((streams * ctx)) "$(mib "$llama_kib")" "$(echo "$vigil_kib / $llama_kib" | bc -l)" \
  "$llama_version" "$(basename "$gguf")" "$(date -u +%FT%TZ)"
