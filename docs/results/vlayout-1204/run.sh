#!/bin/bash
# A/B of the head-major V layout (value_index) against a636e08, interleaved, on this CPU:
# attention_bench (30 layers of SmolLM2 attention, decode after 2,048 and 512 keys) and
# bench_core on SmolLM2 Q4_1 and Q4_0 (pp512, tg128, tg64 after 2,048), 3 rounds, 2 threads.
# Binaries: B/attention_bench_{head,vlay}, B/bench_core_{head,vlay}, B/mem_bandwidth (release
# builds of a636e08 and of the layout commit). Run as:
#   setsid bash -c 'echo -19 > /proc/self/autogroup; docs/results/vlayout-1204/run.sh OUT'
O=$1; B=${B:-/tmp/ab}; Q1=/work/main/.cache/SmolLM2-135M-Instruct.Q4_1.gguf; Q0=/tmp/smol-q4_0.gguf
mkdir -p $O; grep -m1 'model name' /proc/cpuinfo > $O/cpu.txt; grep -m1 '^flags' /proc/cpuinfo >> $O/cpu.txt
for r in 1 2 3; do
  uptime >> $O/load.txt
  $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 > $O/bandwidth-$r.json
  order="head vlay"; [ $((r % 2)) = 0 ] && order="vlay head"
  for v in $order; do
    $B/attention_bench_$v 2048 2 30 decode > $O/attn-decode2048-$v-$r.txt 2>&1
    $B/attention_bench_$v 512 2 60 decode > $O/attn-decode512-$v-$r.txt 2>&1
    $B/bench_core_$v $Q1 --threads 2 --reps 5 --pp 512 --depth 2048 > $O/vigil-q4_1-$v-$r.jsonl 2>&1
    $B/bench_core_$v $Q0 --threads 2 --reps 5 --pp 512 --depth 2048 > $O/vigil-q4_0-$v-$r.jsonl 2>&1
  done
  uptime >> $O/load.txt
done
echo done > $O/DONE
