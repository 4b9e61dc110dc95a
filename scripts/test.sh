#!/usr/bin/env bash
# The project's test command: fetch the real model, tokenizers, the Python clients and headless
# Chromium, then lint, run every Rust test, and drive a real `vigil serve` with the openai and
# layerscale clients (and open the benchmark report in Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/fetch_test_assets.sh)"
eval "$(scripts/setup_python.sh)"
eval "$(scripts/setup_chromium.sh)"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --lib --bins --tests 2>&1 | tee .cache/test.log
cargo build -p vigil --bin vigil
export VIGIL_BIN="$PWD/target/debug/vigil"
status=0
"$VIGIL_TEST_PYTHON" -m pytest tests/api -q -p no:cacheprovider 2>&1 | tee .cache/pytest.log || status=$?
# One closing line over every test binary and the API suite.
awk '/^test result:/ { p += $4; f += $6 } END { printf "rust tests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' .cache/test.log
tail -n 1 .cache/pytest.log | sed 's/^/api tests: /'
exit "$status"
