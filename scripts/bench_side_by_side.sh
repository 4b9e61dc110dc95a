#!/usr/bin/env bash
# Runs `vigil bench` workloads against `vigil serve` and llama.cpp's server on the same model
# and threads, side by side in one run (each target measured in turn while the other idles),
# and writes one result file per workload.
# Usage: LLAMACPP_BIN=... scripts/bench_side_by_side.sh OUT_DIR \
#          "--workload concurrent --concurrency 1,8" ["--workload agent-loop ..." ...]
#   LLAMACPP_BIN: a native llama.cpp build (scripts/setup_llamacpp.sh): `llama-server` with
#   LLAMA_NP parallel slots (default 8) and flash attention off (its best for serving), on
#   LLAMA_GGUF (default: the same file as Vigil; its fastest x86 format is a Q4_0 copy).
#   Without LLAMACPP_BIN, PYTHON=python-with-llama-cpp-python runs llama-cpp-python's one-slot
#   server instead (labelled so in the result files; not llama.cpp at its best).
# Env: GGUF (default .cache/SmolLM2-135M-Instruct.Q4_1.gguf), THREADS (2), VIGIL (target/release/vigil).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench_side_by_side.sh OUT_DIR "WORKLOAD FLAGS"...}
shift
mkdir -p "$out"
gguf=${GGUF:-.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}
vigil=${VIGIL:-target/release/vigil}
python=${PYTHON:-python3}
vport=18431
lport=18432
"$vigil" serve --model "$gguf" --port $vport --threads "$threads" 2>"$out/vigil.log" &
vpid=$!
if [[ -n "${LLAMACPP_BIN:-}" ]]; then
  np=${LLAMA_NP:-8}
  lgguf=${LLAMA_GGUF:-$gguf}
  "$LLAMACPP_BIN/llama-server" -m "$lgguf" --host 127.0.0.1 --port $lport -t "$threads" \
    -np "$np" -fa off -c $((4096 * np)) > "$out/llama-server.log" 2>&1 &
  lpid=$!
  lname=llama-server
  lnote="llama-server (native build) -np $np -fa off on $(basename "$lgguf"), its prompt cache on (default)"
else
  # n_threads_batch defaults to all cores and n_threads to half: pin both. logits_all off, as
  # in llama.cpp's own server; no parallel slots exist in llama-cpp-python (requests queue).
  "$python" -m llama_cpp.server --model "$gguf" --host 127.0.0.1 --port $lport --n_ctx 8192 \
    --n_threads "$threads" --n_threads_batch "$threads" --flash_attn True \
    --interrupt_requests False --logits_all False --verbose False 2>"$out/llama-cpp-python.log" &
  lpid=$!
  lname=llama-cpp-python
  lnote="llama-cpp-python $("$python" -c 'import llama_cpp; print(llama_cpp.__version__)') one-slot server, no --cache (reuses the previous prompt's prefix)"
fi
trap 'kill $vpid $lpid 2>/dev/null || true' EXIT
scripts/record_cpu.sh "$out/cpu.txt"
for spec in "$@"; do
  uptime >> "$out/load.txt"
  # shellcheck disable=SC2086  # each spec is a list of flags
  "$vigil" bench run --target vigil=http://127.0.0.1:$vport \
    --target "$lname=http://127.0.0.1:$lport" --out "$out" \
    --prefix-cache "vigil: on (default); $lname: $lnote" \
    $spec
done
uptime >> "$out/load.txt"
