#!/usr/bin/env bash
# Vigil vs native llama.cpp on a Qwen3-0.6B-shape checkpoint with random weights: prefill
# (pp512) and decode (tg128) tokens/s for
#   Vigil BF16 (HF safetensors dir), Vigil --quantize q8_0 (same dir, quantized at load),
#   llama-bench on the BF16 GGUF and on the Q8_0 GGUF made by llama-quantize,
#   and both engines on the Q4_K_M GGUF llama-quantize makes from the BF16 one (Q4_K, with Q6_K
#   for the output head, attn_v and half the ffn_down: the format most GGUFs are published in),
# all the same weights (scripts/make_qwen3_shape.py, run here if DIR lacks them), in two
# interleaved rounds (llama-bench with flash attention off and on; its better one counts), then
# the decode floor of each format: weight bytes read per decoded
# token / read bandwidth measured in the same round.
#
# Usage: LLAMACPP_BIN=... scripts/bench_qwen3_shape.sh OUT_DIR
#   OUT_DIR receives one file per run, cpu.txt, load.txt, floors.jsonl and summary.md (the
#   ratios: Vigil's median over llama-bench's better mean, per round).
# Env: LLAMACPP_BIN (a native build: scripts/setup_llamacpp.sh), DIR (default
#      ~/.cache/vigil-peers/qwen3-0.6b-shape; ~3 GB), THREADS (2), REPS (5), ROUNDS (2),
#      PYTHON (numpy and gguf; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
L=${LLAMACPP_BIN:?set LLAMACPP_BIN to a native llama.cpp build (scripts/setup_llamacpp.sh)}
O=${1:?usage: bench_qwen3_shape.sh OUT_DIR}; mkdir -p "$O"
dir=${DIR:-$HOME/.cache/vigil-peers/qwen3-0.6b-shape}
threads=${THREADS:-2}
reps=${REPS:-5}
rounds=${ROUNDS:-2}
python=${PYTHON:-python3}
# The floors and the summary read the GGUFs with `gguf`: check before the rounds, not after
# (CHECK_ONLY=1 stops here: bench_cpu_bars.sh asks before its first benchmark).
"$python" -c 'import gguf, numpy' 2> /dev/null || {
    echo "bench_qwen3_shape.sh: $python lacks gguf or numpy; set PYTHON (VLLM_PYTHON from scripts/setup_vllm_cpu.sh has both)" >&2
    exit 2
}
[[ "${CHECK_ONLY:-0}" == 1 ]] && exit 0
bf16_gguf=$dir/qwen3-0.6b-shape-bf16.gguf
q8_gguf=$dir/qwen3-0.6b-shape-q8_0.gguf
q4km_gguf=$dir/qwen3-0.6b-shape-q4_k_m.gguf
if [[ ! -f "$dir/hf/model.safetensors" || ! -f "$bf16_gguf" || ! -f "$q8_gguf" ]]; then
    LLAMACPP_BIN=$L "$python" scripts/make_qwen3_shape.py "$dir" >&2
fi
if [[ ! -f "$q4km_gguf" ]]; then
    "$L/llama-quantize" "$bf16_gguf" "$q4km_gguf.part" Q4_K_M "$threads" > "$dir/q4_k_m.log" 2>&1
    mv "$q4km_gguf.part" "$q4km_gguf"
fi
cargo build -q --release -p vigil-engine --example bench_core --example mem_bandwidth
B=${CARGO_TARGET_DIR:-target}/release/examples
# The CPU, both engines' caps and the host's topology (llama.cpp's folder names its build:
# noamx = -march=native, avx2 = LLAMACPP_MAX_ISA=avx2).
scripts/record_cpu.sh "$O/cpu.txt" "$L"
for r in $(seq 1 "$rounds"); do
    uptime >> "$O/load.txt"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r.json"
    # The bandwidth just before and just after each Vigil run: its floor takes their mean (the
    # round's reading is the first run's "before").
    cp "$O/bandwidth-$r.json" "$O/bandwidth-$r-bf16-before.json"
    "$B/bench_core" "$dir/hf" --threads "$threads" --reps "$reps" --pp 512 --floor > "$O/vigil-bf16-$r.jsonl"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r-bf16-after.json"
    "$L/llama-bench" -m "$bf16_gguf" -t "$threads" -p 512 -n 128 -r "$reps" -fa 0,1 -o json \
        > "$O/llama-bf16-$r.json" 2> "$O/llama-bf16-$r.err"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r-q8_0-before.json"
    "$B/bench_core" "$dir/hf" --threads "$threads" --reps "$reps" --pp 512 --quantize q8_0 --floor \
        > "$O/vigil-q8_0-$r.jsonl"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r-q8_0-after.json"
    "$L/llama-bench" -m "$q8_gguf" -t "$threads" -p 512 -n 128 -r "$reps" -fa 0,1 -o json \
        > "$O/llama-q8_0-$r.json" 2> "$O/llama-q8_0-$r.err"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r-q4_k_m-before.json"
    "$B/bench_core" "$q4km_gguf" --threads "$threads" --reps "$reps" --pp 512 --floor \
        > "$O/vigil-q4_k_m-$r.jsonl"
    "$B/mem_bandwidth" --threads "$threads" --mib 1024 --passes 5 > "$O/bandwidth-$r-q4_k_m-after.json"
    "$L/llama-bench" -m "$q4km_gguf" -t "$threads" -p 512 -n 128 -r "$reps" -fa 0,1 -o json \
        > "$O/llama-q4_k_m-$r.json" 2> "$O/llama-q4_k_m-$r.err"
done
uptime >> "$O/load.txt"

# Decode floor. Bytes per token: every tensor of the GGUF (all layer weights, norms, and
# token_embd counted once, as the tied output head; the embedding row lookup is negligible).
# --quantize q8_0 quantizes every linear weight and the tied output head to Q8_0, as
# llama.cpp's Q8_0 file holds them, so Vigil reads the same bytes; BF16 matrices it packs
# losslessly into 12 bits a value at load (quant::packed_bf16), a quarter fewer bytes than
# this floor counts (the last column, a read of its own bytes, counts what it reads).
# KV reads (F16 in both engines; a few MB at tg128's context) are left out. Bandwidth: the
# mean of the readings just before and after the format's Vigil run, where taken (this host's
# DRAM rate moves by a third within minutes), else the round's first reading.
"$python" - "$O" "$bf16_gguf" "$q8_gguf" "$q4km_gguf" > "$O/floors.jsonl" <<'PY'
import glob, json, os, re, sys
from gguf import GGUFReader
sys.path.insert(0, "scripts")
from summarize_decode_bench import round_bandwidth

out = sys.argv[1]
for fmt, path in zip(("bf16", "q8_0", "q4_k_m"), sys.argv[2:]):
    per_token = sum(int(t.n_bytes) for t in GGUFReader(path).tensors)
    for f in sorted(glob.glob(f"{out}/bandwidth-*.json")):
        m = re.fullmatch(r"bandwidth-(\d+)\.json", os.path.basename(f))
        if not m:
            continue
        bw = round_bandwidth(out, m[1], fmt)
        print(json.dumps({"format": fmt, "bandwidth_file": os.path.basename(f),
                          "bandwidth_gb_s": round(bw / 1e9, 2),
                          "weight_bytes_per_token": per_token,
                          "floor_tok_s": round(bw / per_token, 2)}))
PY

"$python" - "$O" > "$O/summary.md" <<'PY'
import json, statistics, sys

out = sys.argv[1]
floors = [json.loads(l) for l in open(f"{out}/floors.jsonl")]
print(open(f"{out}/cpu.txt").readline().strip(), "\n")
print("| format | round | figure | Vigil median (min–max) | llama-bench mean ± sd (fa) | ratio | floor | Vigil at | share of a read of its own bytes |")
print("|---|---|---|---|---|---|---|---|---|")
r = 1
while True:
    try:
        vigil = {}
        for fmt in ("bf16", "q8_0", "q4_k_m"):
            vigil[fmt] = {j["test"]: j for j in map(json.loads, open(f"{out}/vigil-{fmt}-{r}.jsonl")) if "test" in j}
    except FileNotFoundError:
        break
    for fmt in ("bf16", "q8_0", "q4_k_m"):
        runs = json.load(open(f"{out}/llama-{fmt}-{r}.json"))
        for test in ("pp512", "tg128"):
            mine = [x for x in runs if (x["n_prompt"], x["n_gen"]) == ((512, 0) if test == "pp512" else (0, 128))]
            best = max(mine, key=lambda x: x["avg_ts"])
            v = vigil[fmt][test]
            floor = at = read = ""
            if test == "tg128":
                f = next(f for f in floors if f["format"] == fmt and f["bandwidth_file"] == f"bandwidth-{r}.json")
                floor = f"{f['floor_tok_s']} tok/s"
                at = f"{100 * v['tokens_per_s_median'] / f['floor_tok_s']:.0f} %"
                # bench_core --floor: decode alternated token by token with a read of its bytes.
                fl = vigil[fmt].get("tg128-floor")
                if fl:
                    read = (f"{fl['floor_share_pct_median']:.0f} % ({fl['floor_share_pct_min']:.0f}–{fl['floor_share_pct_max']:.0f}; "
                            f"read {fl['read_gb_s_median']:.1f} GB/s)")
            ratio = v["tokens_per_s_median"] / best["avg_ts"]
            print(f"| {fmt} | {r} | {test} | {v['tokens_per_s_median']:.1f} ({v['tokens_per_s_min']:.1f}–{v['tokens_per_s_max']:.1f}) "
                  f"| {best['avg_ts']:.1f} ± {best['stddev_ts']:.1f} (fa {best['flash_attn']}) "
                  f"| {ratio:.2f}× ({v['tokens_per_s_median']:.1f} / {best['avg_ts']:.1f}) | {floor} | {at} | {read} |")
    r += 1
PY
