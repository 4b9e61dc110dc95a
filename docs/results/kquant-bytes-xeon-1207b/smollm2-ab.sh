#!/bin/bash
# SmolLM2-135M Q4_1 / Q4_0 pp512 and pp2048, before (/tmp/bck_base = f8b8c5e) and after (/tmp/bck_fin
# = 9c663a5), alternated both orders, 2 threads. Run in its own autogroup.
Q1=/work/main/.cache/SmolLM2-135M-Instruct.Q4_1.gguf; Q0=/tmp/smol-q4_0.gguf
date -u; uptime
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="base fin"; else order="fin base"; fi
  for f in Q1 Q0; do for b in $order; do
    echo "$r $f $b $(/tmp/bck_$b ${!f} --threads 2 --reps 5 --pp 512,2048 --tg 0 2>/dev/null | grep -E '"pp(512|2048)"' | sed 's/.*"test": "\([a-z0-9]*\)".*median": \([0-9.]*\), "tokens_per_s_min": \([0-9.]*\), "tokens_per_s_max": \([0-9.]*\).*/\1 \2 (\3-\4)/' | tr '\n' ' ')"
  done; done
done
