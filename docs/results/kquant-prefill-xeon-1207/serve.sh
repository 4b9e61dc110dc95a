#!/bin/bash
# The serving workload (512-token prompts, 128 tokens out, 1 and 8 concurrent streams) on the
# Qwen3-0.6B-shape Q4_K_M GGUF: Vigil before (old = adb158c) and after (new = this morning's
# k-quant work: at 8 streams the Q4_K matrices take the GEMM on interleaved groups and the Q6_K
# ones, the output head among them, the GEMM from 3 rows), and llama-server -np 8 -fa off on
# the same file, side by side in one run (each target measured in turn while the others idle).
# Run in its own autogroup: setsid bash -c 'echo -19 > /proc/self/autogroup; bash serve.sh OUT'
# Needs /tmp/vigil_old, /tmp/vigil_new (the vigil binary of each commit), LLAMACPP_BIN. The Vigil
# servers run --no-persist (two servers, one model they do not share a state directory with).
set -u
O=${1:?usage: serve.sh OUT_DIR}; mkdir -p "$O"
Q=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/qwen3-0.6b-shape-q4_k_m.gguf
L=${LLAMACPP_BIN:?set LLAMACPP_BIN}
/tmp/vigil_old serve --model "$Q" --port 18711 --threads 2 --no-persist > "$O/vigil-old.log" 2>&1 &
p1=$!
/tmp/vigil_new serve --model "$Q" --port 18712 --threads 2 --no-persist > "$O/vigil-new.log" 2>&1 &
p2=$!
"$L/llama-server" -m "$Q" --port 18713 -t 2 -np 8 -fa off -c 32768 > "$O/llama-server.log" 2>&1 &
p3=$!
trap 'kill $p1 $p2 $p3 2>/dev/null; wait' EXIT
scripts/record_cpu.sh "$O/cpu.txt" "$L"
for port in 18711 18712 18713; do
  for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
done
uptime >> "$O/load.txt"
/tmp/vigil_new bench run --workload concurrent --concurrency 1,8 --iterations "${ITERATIONS:-3}" \
  --target vigil-old=http://127.0.0.1:18711 --target vigil-new=http://127.0.0.1:18712 \
  --target llama-server=http://127.0.0.1:18713 --out "$O" \
  --prefix-cache "vigil: on (default); llama-server: -np 8, its prompt cache on (default)" \
  > "$O/bench.log" 2>&1
uptime >> "$O/load.txt"
