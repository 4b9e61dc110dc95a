# Start-to-first-prefill wall time and peak resident memory of bench_core, three loaders
# alternated: /tmp/bench_core_old = d06e9ec (one thread stages each form in a Vec, then copies),
# /tmp/bench_core_staged = 65ce0ed (the pool's threads stage the forms, then one copy),
# /tmp/bench_core_direct = this change (the pool's threads write each form in place).
# Run as: setsid bash -c 'echo -19 > /proc/self/autogroup; bash run.sh > load.txt 2>&1'
M=~/.cache/vigil-peers/qwen3-0.6b-shape/hf
for r in 1 2 3 4 5; do
for b in /tmp/bench_core_old /tmp/bench_core_staged /tmp/bench_core_direct; do
for m in $M /tmp/smol-q4_0.gguf; do
s=$(date +%s.%N)
/usr/bin/time -o /tmp/peak_rss.txt -f "%M" $b $m --threads 2 --reps 1 --pp 16 --tg 0 > /dev/null 2>&1
kb=$(tail -1 /tmp/peak_rss.txt)
e=$(date +%s.%N)
echo "r$r $(basename $b) $(basename $m) $(echo "$e - $s" | bc) s peak_rss_mib $((kb / 1024))"
done; done; done
