#!/usr/bin/env bash
# Where a decode step and a prefill step spend their time: `perf` samples of `vigil generate`
# (2 threads) decoding 256 tokens after a short prompt, then prefilling a ~2,000-token prompt
# (1 output token), model loading skipped with --delay. Prints the hottest symbols of each.
# Usage: scripts/profile_step.sh [GGUF]   (needs `perf`; percentages are of all samples)
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=${1:-.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
vigil=${VIGIL:-target/release/vigil}
out=$(mktemp -d)
long=$(python3 -c 'print(" ".join(f"note {i} of the log: value {i * 7 % 97} ok." for i in range(140)))')

profile() {
  local name=$1 delay_ms=$2
  shift 2
  perf record -q -F 499 -g --delay="$delay_ms" -o "$out/$name.data" -- "$vigil" generate \
    --model "$gguf" --threads 2 "$@" >/dev/null 2>"$out/$name.log"
  echo "== $name: $(tail -1 "$out/$name.log")"
  perf report -i "$out/$name.data" --no-children --sort symbol --percent-limit 1.5 --stdio -g none \
    2>/dev/null | grep -E '^ +[0-9.]+%' | awk '{print $1, $3}' | head -15
}
profile decode 1500 --prompt "Write a long story about a lighthouse keeper." --max-tokens 256 \
  --ignore-eos
profile prefill 1500 --prompt "$long" --max-tokens 1
