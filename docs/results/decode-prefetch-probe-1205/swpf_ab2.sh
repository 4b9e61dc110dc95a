#!/bin/bash
cd /work/main
B=target/release/examples
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf
bw() { $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 | python3 -c "import json,sys;print(json.load(sys.stdin)['bandwidth_gb_s'])"; }
for r in 1 2 3; do
  for fmt in bf16 q8_0; do
    q=""; [ $fmt = q8_0 ] && q="--quantize q8_0"
    for mul in 1 2 4; do
      export VIGIL_SWPF_MUL=$mul
      b1=$(bw)
      t=$($B/bench_core $D --threads 2 --reps 3 --pp 16 --tg 64 $q 2>/dev/null | grep tg64 | python3 -c "import json,sys;print(json.load(sys.stdin)['tokens_per_s_median'])")
      b2=$(bw)
      echo "r$r $fmt mul=$mul tg64=$t bw_before=$b1 bw_after=$b2"
    done
  done
done
