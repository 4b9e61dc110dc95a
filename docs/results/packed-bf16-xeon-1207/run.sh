#!/bin/bash
# BF16 packed into 12 bits a value (VIGIL_PACK_BF16=1, the default) against the same build with
# BF16 interleaved as before (VIGIL_PACK_BF16=0), on the Qwen3-0.6B-shape checkpoint (HF
# safetensors, as scripts/bench_qwen3_shape.sh runs it), beside llama-bench on the same weights
# (BF16 GGUF, flash attention off and on, the better counts), alternated, 2 rounds; then both
# held to AVX2 (Zen 3's path). This folder's run took the first version, the working tree over
# b0e7d8c (commit.txt): its packed decode tiles widened by unpacking with zeros and its GEMM
# unpacked each block of columns inside its loop; packed-bf16-xeon-1207b has the version that
# landed. Run in its own autogroup:
#   setsid bash -c "echo -19 > /proc/self/autogroup; bash docs/results/packed-bf16-xeon-1207/run.sh"
set -u
O=${1:-docs/results/packed-bf16-xeon-1207}
mkdir -p $O
L=${LLAMACPP_BIN:?}
Q=~/.cache/vigil-peers/qwen3-0.6b-shape
B=target/release/examples
scripts/record_cpu.sh $O/cpu.txt $L
git rev-parse HEAD > $O/commit.txt
for r in 1 2; do
  uptime >> $O/load.txt
  for pk in 0 1; do
    VIGIL_PACK_BF16=$pk $B/bench_core $Q/hf --threads 2 --reps 5 --pp 512 --floor > $O/vigil-pack$pk-$r.jsonl 2>&1
  done
  $L/llama-bench -m $Q/qwen3-0.6b-shape-bf16.gguf -t 2 -p 512 -n 128 -r 5 -fa 0,1 -o json > $O/llama-bf16-$r.json 2>/dev/null
  for pk in 0 1; do
    VIGIL_MAX_ISA=avx2 VIGIL_PACK_BF16=$pk $B/bench_core $Q/hf --threads 2 --reps 5 --pp 512 > $O/avx2-pack$pk-$r.jsonl 2>&1
  done
  uptime >> $O/load.txt
done
echo done > $O/DONE
