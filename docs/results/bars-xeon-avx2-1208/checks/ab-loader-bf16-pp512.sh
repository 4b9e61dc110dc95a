#!/bin/bash
# A/B: d0c9b50 vs HEAD bench_core, Qwen3-shape BF16 pp512, held to AVX2
M=$HOME/.cache/vigil-peers/qwen3-0.6b-shape/hf
OLD=/tmp/wt-d0c-target/release/examples/bench_core
NEW=/work/main/target/release/examples/bench_core
export VIGIL_MAX_ISA=${ISA:-avx2}
for r in 4 5 6 7 8; do
  for b in OLD NEW; do
    bin=${!b}
    $bin $M --threads 2 --reps 3 --pp 512 --tg 0 > /tmp/ab/$b-$r.jsonl 2>/tmp/ab/$b-$r.err &
    p=$!
    sleep 6; grep -E 'AnonHugePages|Rss' /proc/$p/smaps_rollup 2>/dev/null | tr '\n' ' ' > /tmp/ab/$b-$r.mem
    wait $p
    echo "$b $r $(grep -o '"pp512[^}]*' /tmp/ab/$b-$r.jsonl | head -1 | cut -c1-200) $(cat /tmp/ab/$b-$r.mem)"
  done
done
