#!/bin/bash
# base = dadc95f; sk2 = score prefetch two key groups ahead; both = sk2 and VALUE_PREFETCH 64.
# Binaries are attention_bench builds of each variant copied to /tmp/exp/attn_NAME.
for i in 1 2 3 4; do
  for b in "$@"; do
    echo -n "$b avx2 16k r$i: "; VIGIL_MAX_ISA=avx2 /tmp/exp/attn_$b 16384 2 10 decode
  done
done
for i in 1 2; do
  for b in "$@"; do
    echo -n "$b nat 16k r$i: "; /tmp/exp/attn_$b 16384 2 10 decode
    echo -n "$b avx2 2k r$i: "; VIGIL_MAX_ISA=avx2 /tmp/exp/attn_$b 2048 2 30 decode
    echo -n "$b nat 2k r$i: "; /tmp/exp/attn_$b 2048 2 30 decode
    echo -n "$b avx2 prefill r$i: "; VIGIL_MAX_ISA=avx2 /tmp/exp/attn_$b 2048 1 4
  done
done
