#!/bin/bash
# Vigil (HEAD) vs llama-bench, Qwen3-shape BF16 pp512, both AVX2, alternated
D=$HOME/.cache/vigil-peers/qwen3-0.6b-shape
L=/root/.cache/vigil-peers/llama.cpp-0.3.36-a408aaa422d8-avx2/bin
NEW=/work/main/target/release/examples/bench_core
for r in 1 2 3 4 5; do
  VIGIL_MAX_ISA=avx2 $NEW $D/hf --threads 2 --reps 3 --pp 512 --tg 0 2>/dev/null | python3 -c "
import json,sys
for l in sys.stdin:
    j=json.loads(l)
    if j.get('test')=='pp512': print('vigil',$r,j['tokens_per_s_median'],j['tokens_per_s_min'],j['tokens_per_s_max'])"
  $L/llama-bench -m $D/qwen3-0.6b-shape-bf16.gguf -t 2 -p 512 -n 0 -r 3 -fa 1 -o json 2>/dev/null | python3 -c "
import json,sys
for j in json.load(sys.stdin): print('llama',$r,round(j['avg_ts'],1),round(j['stddev_ts'],1))"
  VIGIL_MAX_ISA=avx2 /work/main/target/release/examples/fma_peak 2>/dev/null | tail -1 | cut -c1-90
done
