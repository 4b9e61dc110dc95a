#!/usr/bin/env bash
# Prefill (pp512, pp2048) and decode (tg128) tokens/s of Vigil and llama.cpp on the same model
# and threads, in one run. Needs llama-cpp-python (pip install llama-cpp-python) in PYTHON.
# Usage: scripts/bench_core.sh [GGUF] [THREADS] [REPS]  → JSON lines on stdout.
# bench_llamacpp.py decodes after a 128-token prompt, so bench_core does too here
# (`--tg-prompt 128`); against llama-bench, whose tg128 starts from an empty context,
# bench_core's default (a 1-token prompt) is the matching figure.
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=${1:-${VIGIL_TEST_GGUF:-.cache/SmolLM2-135M-Instruct.Q4_1.gguf}}
threads=${2:-2}
reps=${3:-5}
python=${PYTHON:-python3}
cargo build -q --release -p vigil-engine --example bench_core
echo "{\"machine\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\", \"cores\": $(nproc), \"model\": \"$(basename "$gguf")\", \"date\": \"$(date -u +%FT%TZ)\"}"
./target/release/examples/bench_core "$gguf" --threads "$threads" --reps "$reps" --tg-prompt 128
OMP_WAIT_POLICY=passive "$python" scripts/bench_llamacpp.py --gguf "$gguf" --threads "$threads" --reps "$reps" --flash-attn both
