#!/bin/bash
# A/B of b1d0ccc (attention in runs of 256 keys, decode by runs) against 374897b, interleaved.
O=$1; M=/work/main/.cache/SmolLM2-135M-Instruct.Q4_1.gguf; B=/tmp/ab
mkdir -p $O; grep -m1 'model name' /proc/cpuinfo > $O/cpu.txt; grep -m1 '^flags' /proc/cpuinfo >> $O/cpu.txt
for r in 1 2 3; do
  uptime >> $O/load.txt
  $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 > $O/bandwidth-$r.json
  order="base new"; [ $((r % 2)) = 0 ] && order="new base"
  for v in $order; do
    $B/attention_bench_$v 2048 2 30 decode > $O/attn-decode2048-$v-$r.txt 2>&1
    $B/attention_bench_$v 512 2 60 decode > $O/attn-decode512-$v-$r.txt 2>&1
    $B/attention_bench_$v 1024 1 5 > $O/attn-prefill1024-$v-$r.txt 2>&1
    $B/bench_core_$v $M --threads 2 --reps 5 --pp 2048 --tg 0 --depth 2048 > $O/vigil-q4_1-$v-$r.jsonl 2>&1
  done
  uptime >> $O/load.txt
done
echo done > $O/DONE
