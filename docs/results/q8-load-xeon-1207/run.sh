# `--quantize q8_0` load: start-to-first-prefill wall time and peak resident memory of bench_core,
# alternated 5 rounds: /tmp/bench_core_main = 7c98242 (the rows quantized on the loading thread),
# /tmp/bench_core_q8pool = this change (in chunks of rows on the load's thread pool).
# Run as: setsid bash -c 'echo -19 > /proc/self/autogroup; bash run.sh > load.txt 2>&1'
M=~/.cache/vigil-peers/qwen3-0.6b-shape/hf
for r in 1 2 3 4 5; do
for b in /tmp/bench_core_main /tmp/bench_core_q8pool; do
s=$(date +%s.%N)
/usr/bin/time -o /tmp/peak_rss.txt -f "%M" $b $M --quantize q8_0 --threads 2 --reps 1 --pp 16 --tg 0 > /dev/null 2>&1
kb=$(tail -1 /tmp/peak_rss.txt)
e=$(date +%s.%N)
echo "r$r $(basename $b) qwen3-shape-hf-q8_0 $(echo "$e - $s" | bc) s peak_rss_mib $((kb / 1024))"
done; done
