#!/bin/bash
M=/root/.cache/vigil-peers/qwen3-0.6b-shape/hf
for isa in native avx2; do
  for pair in 1 2 3; do
    for b in base new; do
      if [ $isa = avx2 ]; then export VIGIL_MAX_ISA=avx2; else unset VIGIL_MAX_ISA; fi
      echo "== $isa pair $pair $b $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
      ./${b}_bench_core $M --pp 512 --reps 3 --tg 64 --floor 2>/dev/null
    done
  done
done
