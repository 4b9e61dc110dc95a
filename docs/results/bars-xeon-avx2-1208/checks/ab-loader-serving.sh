#!/bin/bash
# d0c9b50 vs HEAD vigil serve, held to AVX2, SmolLM2 Q4_1, 8 streams, alternated fresh servers
cd /work/main
OLD=/tmp/wt-d0c-target/release/vigil
NEW=/work/main/target/release/vigil
for r in 1 2; do
  for b in OLD NEW; do
    bin=${!b}
    h=$(mktemp -d)
    VIGIL_HOME=$h VIGIL_MAX_ISA=avx2 $bin serve --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --port 18791 --threads 2 > /tmp/ab/serve-$b-$r.log 2>&1 &
    p=$!
    for _ in $(seq 120); do curl -sf localhost:18791/health > /dev/null && break; sleep 1; done
    mkdir -p /tmp/ab/sv-$b-$r
    $NEW bench run --workload concurrent --concurrency 8 --iterations 4 --target vigil=http://127.0.0.1:18791 --out /tmp/ab/sv-$b-$r > /tmp/ab/sv-$b-$r/bench.log 2>&1
    echo "$b $r $(grep 'ok;' /tmp/ab/sv-$b-$r/bench.log)"
    kill $p; wait $p 2>/dev/null; rm -rf $h
  done
done
