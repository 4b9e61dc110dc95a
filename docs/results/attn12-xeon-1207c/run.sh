#!/bin/bash
# Prefill before (af3c981) and after (6ed7d0b, AVX-512 attention passes of 12 queries) against
# llama-bench -fa 1, alternated, 2 rounds. Run in its own autogroup:
#   setsid bash -c "echo -19 > /proc/self/autogroup; bash docs/results/attn12-xeon-1207c/run.sh"
# /tmp/bc_base and /tmp/bc_new: bench_core built at af3c981 and 6ed7d0b.
set -u
O=docs/results/attn12-xeon-1207c
L=${LLAMACPP_BIN:?}
Q=~/.cache/vigil-peers/qwen3-0.6b-shape
S0=/tmp/smol-q4_0.gguf; S1=.cache/SmolLM2-135M-Instruct.Q4_1.gguf; G=.cache/gemma-3-270m-q4_k_m.gguf
for r in 1 2; do
  uptime >> $O/load.txt
  for b in base new; do
    /tmp/bc_$b $S0 --threads 2 --reps 3 --pp 512,2048 --tg 0 > $O/$b-smol-q4_0-$r.jsonl 2>&1
    /tmp/bc_$b $S1 --threads 2 --reps 3 --pp 512,2048 --tg 0 > $O/$b-smol-q4_1-$r.jsonl 2>&1
    /tmp/bc_$b $Q/qwen3-0.6b-shape-bf16.gguf --threads 2 --reps 2 --pp 512,2048 --tg 0 > $O/$b-qwen3-bf16-$r.jsonl 2>&1
    /tmp/bc_$b $Q/qwen3-0.6b-shape-q8_0.gguf --threads 2 --reps 2 --pp 512,2048 --tg 0 > $O/$b-qwen3-q8_0-$r.jsonl 2>&1
    /tmp/bc_$b $Q/qwen3-0.6b-shape-q5_k_m.gguf --threads 2 --reps 2 --pp 512 --tg 0 > $O/$b-qwen3-q5_k_m-$r.jsonl 2>&1
    /tmp/bc_$b $G --threads 2 --reps 3 --pp 512 --tg 0 > $O/$b-gemma-$r.jsonl 2>&1
  done
  $L/llama-bench -m $S0 -t 2 -p 512,2048 -n 0 -r 3 -fa 1 -o json > $O/llama-smol-q4_0-$r.json 2>/dev/null
  $L/llama-bench -m $S1 -t 2 -p 512,2048 -n 0 -r 3 -fa 1 -o json > $O/llama-smol-q4_1-$r.json 2>/dev/null
  $L/llama-bench -m $Q/qwen3-0.6b-shape-bf16.gguf -t 2 -p 512,2048 -n 0 -r 2 -fa 1 -o json > $O/llama-qwen3-bf16-$r.json 2>/dev/null
  $L/llama-bench -m $Q/qwen3-0.6b-shape-q8_0.gguf -t 2 -p 512,2048 -n 0 -r 2 -fa 1 -o json > $O/llama-qwen3-q8_0-$r.json 2>/dev/null
  $L/llama-bench -m $Q/qwen3-0.6b-shape-q5_k_m.gguf -t 2 -p 512 -n 0 -r 2 -fa 1 -o json > $O/llama-qwen3-q5_k_m-$r.json 2>/dev/null
  $L/llama-bench -m $G -t 2 -p 512 -n 0 -r 3 -o json > $O/llama-gemma-$r.json 2>/dev/null
  uptime >> $O/load.txt
done
echo done > $O/DONE
