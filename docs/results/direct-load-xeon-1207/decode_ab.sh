# Decode and prefill from the resident copy, one-thread loader (d06e9ec) against the in-place one,
# alternated 3 rounds: the copy's pages and layout must read as fast as before.
# Run as: setsid bash -c 'echo -19 > /proc/self/autogroup; bash decode_ab.sh > decode_ab.txt 2>&1'
M=~/.cache/vigil-peers/qwen3-0.6b-shape/hf
for r in 1 2 3; do
for b in /tmp/bench_core_old /tmp/bench_core_direct; do
for m in $M /tmp/smol-q4_0.gguf; do
echo "r$r $(basename $b) $(basename $m) $($b $m --threads 2 --reps 3 --pp 128 --tg 128 2>/dev/null | grep -o '"test": "[a-z0-9]*".*"tokens_per_s_median": [0-9.]*' | tr '\n' ' ')"
done; done; done
