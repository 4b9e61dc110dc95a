# Peak resident memory and start-to-first-prefill wall time of bench_core, alternated 5 rounds:
# /tmp/bench_core_q8pool = 088fc8f (every source held until the whole resident copy is written),
# /tmp/bench_core_release = this change (each source dropped once its bytes are written).
# Run as: setsid bash -c 'echo -19 > /proc/self/autogroup; bash run.sh > load.txt 2>&1'
M=~/.cache/vigil-peers/qwen3-0.6b-shape/hf
for r in 1 2 3 4 5; do
for b in /tmp/bench_core_q8pool /tmp/bench_core_release; do
for q in q8_0 none; do
s=$(date +%s.%N)
/usr/bin/time -o /tmp/peak_rss.txt -f "%M" $b $M --quantize $q --threads 2 --reps 1 --pp 16 --tg 0 > /dev/null 2>&1
kb=$(tail -1 /tmp/peak_rss.txt)
e=$(date +%s.%N)
echo "r$r $(basename $b) qwen3-shape-hf --quantize $q $(echo "$e - $s" | bc) s peak_rss_mib $((kb / 1024))"
done; done; done
