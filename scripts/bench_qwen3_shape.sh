#!/usr/bin/env bash
# Vigil vs llama.cpp on a Qwen3-0.6B-shape checkpoint with random weights (issue 6): prefill
# (pp512, optionally pp2048) and decode (tg128) tokens/s for
#   Vigil BF16 (HF safetensors dir), Vigil --quantize q8_0 (same dir, quantized at load),
#   llama.cpp BF16 GGUF, llama.cpp Q8_0 GGUF (made by llama.cpp's own quantizer),
# all the same weights (scripts/make_qwen3_shape.py, run here if DIR lacks them), then the
# decode floor of each format: weight bytes read per decoded token / measured read bandwidth.
#
# Usage: scripts/bench_qwen3_shape.sh [--pp2048]      → JSON lines on stdout.
# Env: DIR (default /work/cache/qwen3-0.6b-shape), THREADS (2), REPS (5),
#      FLASH_ATTN for llama.cpp (on|off|both, default on: llama-bench's CPU default),
#      PYTHON (default /work/venv/bin/python: numpy, gguf, llama-cpp-python).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${DIR:-/work/cache/qwen3-0.6b-shape}
threads=${THREADS:-2}
reps=${REPS:-5}
flash_attn=${FLASH_ATTN:-on}
python=${PYTHON:-/work/venv/bin/python}
pp=512
if [[ "${1:-}" == "--pp2048" ]]; then pp=512,2048; fi
bf16_gguf=$dir/qwen3-0.6b-shape-bf16.gguf
q8_gguf=$dir/qwen3-0.6b-shape-q8_0.gguf
if [[ ! -f "$dir/hf/model.safetensors" || ! -f "$bf16_gguf" || ! -f "$q8_gguf" ]]; then
    "$python" scripts/make_qwen3_shape.py "$dir" >&2
fi
cargo build -q --release -p vigil-engine --example bench_core --example mem_bandwidth
bench_core=${CARGO_TARGET_DIR:-target}/release/examples/bench_core

# Tag each result line with the weight format, keeping it one JSON object per line.
tag() { sed -u "s/^{/{\"format\": \"$1\", /"; }

echo "{\"machine\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\", \"cores\": $(nproc), \"model\": \"qwen3-0.6b-shape (random)\", \"date\": \"$(date -u +%FT%TZ)\"}"
"$bench_core" "$dir/hf" --threads "$threads" --reps "$reps" --pp "$pp" | tag bf16
"$bench_core" "$dir/hf" --threads "$threads" --reps "$reps" --pp "$pp" --quantize q8_0 | tag q8_0
for f in bf16 q8_0; do
    OMP_WAIT_POLICY=passive "$python" scripts/bench_llamacpp.py --gguf "$dir/qwen3-0.6b-shape-$f.gguf" \
        --threads "$threads" --reps "$reps" --flash-attn "$flash_attn" --pp "$pp" | tag "$f"
done

# Decode floor. Bytes per token: every tensor of the GGUF (all layer weights, norms, and
# token_embd counted once, as the tied output head; the embedding row lookup is negligible).
# Vigil reads the same bytes: BF16 matrices stay BF16, and --quantize q8_0 quantizes every
# linear weight and the tied output head to Q8_0, as llama.cpp's Q8_0 file holds them.
# KV-cache reads (F16 in both engines; ~22 MB per token at tg128's mean context of 192) are
# not included. Bandwidth: the mem_bandwidth example (THREADS threads stream-summing their own
# slices of a 1 GiB buffer, ≫ L3; best of 5).
bandwidth_line=$("${bench_core%/*}/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5)
echo "$bandwidth_line"
"$python" - "$bandwidth_line" "$bf16_gguf" "$q8_gguf" <<'EOF'
import json, sys
from gguf import GGUFReader

bandwidth = json.loads(sys.argv[1])["bandwidth_gb_s"] * 1e9
for fmt, path in zip(("bf16", "q8_0"), sys.argv[2:]):
    per_token = sum(int(t.n_bytes) for t in GGUFReader(path).tensors)
    print(json.dumps({
        "decode_floor": fmt,
        "weight_bytes_per_token": per_token,
        "floor_ms_per_token": round(1e3 * per_token / bandwidth, 2),
        "max_tokens_per_s": round(bandwidth / per_token, 2),
    }))
EOF
