#!/usr/bin/env bash
# Runs `vigil bench` workloads against `vigil serve` and llama-cpp-python's server on the same
# model and threads, side by side in one run (each target measured in turn while the other
# idles), and writes one result file per workload.
# Usage: PYTHON=python-with-llama-cpp-python scripts/bench_side_by_side.sh OUT_DIR \
#          "--workload concurrent --concurrency 1,8" ["--workload agent-loop ..." ...]
# Env: GGUF (default .cache/SmolLM2-135M-Instruct.Q4_1.gguf), THREADS (2), VIGIL (target/release/vigil).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench_side_by_side.sh OUT_DIR "WORKLOAD FLAGS"...}
shift
gguf=${GGUF:-.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}
vigil=${VIGIL:-target/release/vigil}
python=${PYTHON:-python3}
vport=18431
lport=18432
"$vigil" serve --model "$gguf" --port $vport --threads "$threads" 2>/tmp/bench-vigil.log &
vpid=$!
# n_threads_batch defaults to all cores and n_threads to half: pin both. logits_all off, as in
# llama.cpp's own server; no parallel slots exist in llama-cpp-python (requests queue).
"$python" -m llama_cpp.server --model "$gguf" --host 127.0.0.1 --port $lport --n_ctx 8192 \
  --n_threads "$threads" --n_threads_batch "$threads" --flash_attn True \
  --interrupt_requests False --logits_all False --verbose False 2>/tmp/bench-llamacpp.log &
lpid=$!
trap 'kill $vpid $lpid 2>/dev/null || true' EXIT
llama_version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
for spec in "$@"; do
  # shellcheck disable=SC2086  # each spec is a list of flags
  "$vigil" bench run --target vigil=http://127.0.0.1:$vport \
    --target "llama.cpp=http://127.0.0.1:$lport" --out "$out" \
    --prefix-cache "vigil: on (default); llama.cpp: llama-cpp-python $llama_version, no --cache (reuses the previous prompt's prefix)" \
    $spec
done
