#!/usr/bin/env bash
# The project's test command: fetch the real model and tokenizers, then lint and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/fetch_test_assets.sh)"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --lib --bins --tests 2>&1 | tee .cache/test.log
# One closing line over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' .cache/test.log
