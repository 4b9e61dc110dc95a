#!/bin/bash
# Vigil a636e08 (head) against 5f8edbc (vlay: head-major V), serving 512 in / 128 out at 8 and
# 32 streams, both servers up at once and measured alternately, 3 rounds. B holds vigil_head and
# vigil_vlay (release builds). Run in a setsid shell with `echo -19 > /proc/self/autogroup`.
cd /work/main; B=${B:-/tmp/ab}; O=docs/results/vlayout-1204/serving-ab
grep -m1 'model name' /proc/cpuinfo > $O/cpu.txt; grep -m1 '^flags' /proc/cpuinfo >> $O/cpu.txt
M=.cache/SmolLM2-135M-Instruct.Q4_1.gguf
$B/vigil_head serve --model $M --port 18711 --threads 2 --state-dir /tmp/sab-head > $O/head.log 2>&1 & hp=$!
$B/vigil_vlay serve --model $M --port 18712 --threads 2 --state-dir /tmp/sab-vlay > $O/vlay.log 2>&1 & vp=$!
trap 'kill $hp $vp 2>/dev/null || true' EXIT
for port in 18711 18712; do for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done; done
for r in 1 2 3; do
  uptime >> $O/load.txt
  order="head vlay"; [ $((r % 2)) = 0 ] && order="vlay head"
  for v in $order; do
    port=18711; [ $v = vlay ] && port=18712
    mkdir -p $O/$v-$r
    $B/vigil_vlay bench run --workload concurrent --concurrency 8,32 --iterations 4 \
      --target $v=http://127.0.0.1:$port --out $O/$v-$r > $O/$v-$r/bench.log 2>&1
  done
done
uptime >> $O/load.txt
echo done > $O/DONE
