#!/bin/bash
# A/B of the attention changes: old = c74fe83, new = working tree. SmolLM2 Q4_0, 2 threads.
G=/tmp/smol-q4_0.gguf
for isa in avx2 native; do
  for i in 1 2 3; do
    for v in old new; do
      for pp in 512 2048; do
        echo -n "$isa $v round $i pp$pp "
        if [ $isa = avx2 ]; then VIGIL_MAX_ISA=avx2 /tmp/exp/bc_$v $G --threads 2 --reps 3 --pp $pp --tg 0 2>/dev/null | tail -1; else /tmp/exp/bc_$v $G --threads 2 --reps 3 --pp $pp --tg 0 2>/dev/null | tail -1; fi
      done
    done
  done
done
