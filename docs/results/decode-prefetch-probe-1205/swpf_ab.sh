#!/bin/bash
# software prefetch on/off in the decode tiles, Qwen3 shape BF16 and Q8_0 tg, with bandwidth brackets
cd /work/main
B=target/release/examples
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf
bw() { $B/mem_bandwidth --threads 2 --mib 1024 --passes 5 | python3 -c "import json,sys;print(json.load(sys.stdin)['bandwidth_gb_s'])"; }
for r in 1 2 3; do
  for fmt in bf16 q8_0; do
    q=""; [ $fmt = q8_0 ] && q="--quantize q8_0"
    for pf in on off; do
      if [ $pf = off ]; then export VIGIL_NO_SWPF=1; else unset VIGIL_NO_SWPF; fi
      b1=$(bw)
      t=$($B/bench_core $D --threads 2 --reps 3 --pp 16 --tg 64 $q 2>/dev/null | grep tg64 | python3 -c "import json,sys;print(json.load(sys.stdin)['tokens_per_s_median'])")
      b2=$(bw)
      echo "r$r $fmt swpf=$pf tg64=$t bw_before=$b1 bw_after=$b2"
    done
  done
done
