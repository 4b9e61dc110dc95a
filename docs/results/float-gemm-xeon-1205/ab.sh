#!/bin/bash
# A/B of the float prefill GEMM: 9a53971 (old), e07a4bf (sums in registers), KC 1024 on AVX2 (kc).
O=$1
HF=/root/.cache/vigil-peers/qwen3-0.6b-shape/hf
bash /work/main/scripts/record_cpu.sh $O/cpu.txt; uptime >> $O/cpu.txt
/tmp/exp/fma_peak > $O/fma_peak.txt
{
for isa in native avx2; do
  for i in 1 2 3; do
    for v in old new kc; do
      echo "== $isa $v round $i"
      if [ $isa = avx2 ]; then VIGIL_MAX_ISA=avx2 /tmp/exp/mm_$v 512 2 10 bf16x8; else /tmp/exp/mm_$v 512 2 10 bf16x8; fi
    done
  done
done
} > $O/ab-matmul.txt
{
for isa in native avx2; do
  for i in 1 2 3; do
    for v in old new kc; do
      echo "== $isa $v round $i"
      if [ $isa = avx2 ]; then VIGIL_MAX_ISA=avx2 /tmp/exp/bc_$v $HF --threads 2 --reps 3 --pp 512 --tg 0; else /tmp/exp/bc_$v $HF --threads 2 --reps 3 --pp 512 --tg 0; fi
    done
  done
done
} > $O/ab-bench-core.txt 2>&1
