#!/bin/bash
# attention_bench (one layer's prefill attention, f16 KV) before (af3c981's kernels, /tmp/ab_base)
# and after (6ed7d0b, /tmp/ab_head), alternated, 3 rounds; best of 4 reps each.
# setsid bash -c "echo -19 > /proc/self/autogroup; bash docs/results/attn12-xeon-1207c/kernel.sh > docs/results/attn12-xeon-1207c/kernel.txt"
for r in 1 2 3; do
  for b in base head; do
    for shape in 0 1; do for len in 512 2048; do
      echo "$b QWEN3=$shape $len 1thr $(QWEN3=$shape /tmp/ab_$b $len 1 4)"
    done; done
    echo "$b QWEN3=0 2048 2thr $(/tmp/ab_$b 2048 2 4)"
  done
done
