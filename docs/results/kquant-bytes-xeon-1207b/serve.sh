#!/bin/bash
# The serving workload (512-token prompts, 128 tokens out, 1, 5 and 8 concurrent streams) on the
# Qwen3-0.6B-shape Q5_K_M GGUF (FMT=q4_k_m for Q4_K_M): Vigil before (base = f8b8c5e) and after
# (fin = 9c663a5: k-quant quants packed as bytes, the 4-row rest tile, Q5_K interleaved at
# load), and llama-server -np 8 -fa off on the same file, side by side in one run (each target
# measured in turn while the others idle).
# Run in its own autogroup: setsid bash -c "echo -19 > /proc/self/autogroup; bash serve.sh OUT"
# Needs /tmp/vigil_base, /tmp/vigil_fin (the vigil binary of each commit), LLAMACPP_BIN. The
# Vigil servers run --no-persist (two servers, one model they do not share a state directory with).
set -u
O=${1:?usage: serve.sh OUT_DIR}; mkdir -p "$O"
Q=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/qwen3-0.6b-shape-${FMT:-q5_k_m}.gguf
L=${LLAMACPP_BIN:?set LLAMACPP_BIN}
/tmp/vigil_base serve --model "$Q" --port 18711 --threads 2 --no-persist > "$O/vigil-base.log" 2>&1 &
p1=$!
/tmp/vigil_fin serve --model "$Q" --port 18712 --threads 2 --no-persist > "$O/vigil-fin.log" 2>&1 &
p2=$!
"$L/llama-server" -m "$Q" --port 18713 -t 2 -np 8 -fa off -c 32768 > "$O/llama-server.log" 2>&1 &
p3=$!
trap 'kill $p1 $p2 $p3 2>/dev/null; wait' EXIT
scripts/record_cpu.sh "$O/cpu.txt" "$L"
for port in 18711 18712 18713; do
  for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
done
uptime >> "$O/load.txt"
/tmp/vigil_fin bench run --workload concurrent --concurrency 1,5,8 --iterations "${ITERATIONS:-3}" \
  --target vigil-base=http://127.0.0.1:18711 --target vigil-fin=http://127.0.0.1:18712 \
  --target llama-server=http://127.0.0.1:18713 --out "$O" \
  --prefix-cache "vigil: on (default); llama-server: -np 8, its prompt cache on (default)" \
  > "$O/bench.log" 2>&1
uptime >> "$O/load.txt"
