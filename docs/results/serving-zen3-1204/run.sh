#!/bin/bash
# bench_serving_peers.sh without vLLM (not set up on this machine): Vigil and llama-server -np 8.
# Usage: docs/results/serving-zen3-1204/run.sh [OUT_DIR] (default: this folder).
cd /work/main
L=/root/.cache/vigil-peers/llama.cpp-0.3.36-fb8356088412-noamx/bin
O=${1:-docs/results/serving-zen3-1204}; mkdir -p $O
grep -m1 'model name' /proc/cpuinfo > "$O/cpu.txt"; grep -m1 '^flags' /proc/cpuinfo >> "$O/cpu.txt"
V=target/release/vigil
$V serve --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --port 18701 --threads 2 > "$O/vigil.log" 2>&1 &
vp=$!
$L/llama-server -m /tmp/smol-q4_0.gguf --port 18702 -t 2 -np 8 -fa off -c 32768 > "$O/llama-server.log" 2>&1 &
lp=$!
trap 'kill $vp $lp 2>/dev/null || true' EXIT
for port in 18701 18702; do for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done; done
uptime >> "$O/load.txt"
$V bench run --workload concurrent --concurrency 1,8,32 --iterations 4 \
  --target vigil=http://127.0.0.1:18701 --target llama-server=http://127.0.0.1:18702 --out "$O" \
  --prefix-cache "vigil: on (default); llama-server: -np 8, its prompt cache on (default)" > "$O/bench.log" 2>&1
uptime >> "$O/load.txt"
echo done > $O/DONE
