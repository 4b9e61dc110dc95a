#!/bin/bash
# A/B: old (HEAD) vs new (exp2 softmax), alternated
for isa in avx2 native; do
  for r in 1 2 3; do
    for b in old new; do
      if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi
      echo "attn $isa $b $r $(/tmp/$b/attention_bench 2048 2 5 2>&1 | tail -1)"
      echo "attn-dec $isa $b $r $(/tmp/$b/attention_bench 2048 2 30 decode 2>&1 | tail -1)"
    done
  done
done
for r in 1 2 3; do
  for b in old new; do
    export VIGIL_MAX_ISA=avx2
    echo "core avx2 $b $r $(/tmp/$b/bench_core /tmp/smol-q4_0.gguf --threads 2 --reps 3 --pp 512,2048 --tg 0 --depth 2048 2>&1 | tr '\n' ' ')"
  done
done
