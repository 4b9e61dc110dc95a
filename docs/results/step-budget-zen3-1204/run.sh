#!/bin/bash
# The step-budget sweep (2026-12-04, Zen 3): two vigil servers, --max-batched-tokens 512 and 256, side by side; sweep3 ran --workload prefill --iterations 3 instead.
cd /work/main
O=/tmp/sweep
V=target/release/vigil
$V serve --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --port 18711 --threads 2 --state-dir /tmp/sweep/s512 --max-batched-tokens 512 > $O/v512.log 2>&1 &
a=$!
$V serve --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --port 18712 --threads 2 --state-dir /tmp/sweep/s256 --max-batched-tokens 256 > $O/v256.log 2>&1 &
b=$!
trap 'kill $a $b 2>/dev/null || true' EXIT
for port in 18711 18712; do for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done; done
uptime >> $O/load.txt
$V bench run --workload concurrent --concurrency 8,32 --iterations 4 \
  --target b512=http://127.0.0.1:18711 --target b256=http://127.0.0.1:18712 --out $O > $O/bench.log 2>&1
uptime >> $O/load.txt
echo done > $O/DONE
