#!/bin/bash
# base = dadc95f code; t8, t16 = split_rows with num_threads() * 8 / * 16 tasks. Columns: tok/s, share of a read of its own bytes (%), read GB/s.
HF=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf
for i in 1 2 3; do
  for b in base t8 t16; do
    echo -n "$b bf16 r$i: "; /tmp/exp/bc_$b $HF --threads 2 --reps 3 --pp 16 --tg 128 --floor 2>/dev/null | grep floor | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['tokens_per_s_median'], d['floor_share_pct_median'], d['read_gb_s_median'])"
    echo -n "$b q4_0 r$i: "; /tmp/exp/bc_$b /tmp/smol-q4_0.gguf --threads 2 --reps 5 --pp 16 --tg 128 2>/dev/null | grep tg128 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['tokens_per_s_median'])"
  done
done
