#!/bin/bash
# A/B of the attention kernels: attn_old = c74fe83, attn_head = 4db51a4 (attention_bench),
# one layer of SmolLM2's prefill attention over 2,048 tokens on 1 thread (best of 4), and 30
# layers of decode after 2,048 tokens on 2 threads (median of 30), held to AVX2 and native.
for i in 1 2 3; do
  for b in old head; do
    echo -n "avx2 $b round $i: "; VIGIL_MAX_ISA=avx2 /tmp/exp/attn_$b 2048 1 4
    echo -n "native $b round $i: "; /tmp/exp/attn_$b 2048 1 4
  done
done
for i in 1 2; do
  for b in old head; do
    echo -n "avx2 $b round $i: "; VIGIL_MAX_ISA=avx2 /tmp/exp/attn_$b 2048 2 30 decode
    echo -n "native $b round $i: "; /tmp/exp/attn_$b 2048 2 30 decode
  done
done
