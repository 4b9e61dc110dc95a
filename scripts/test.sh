#!/usr/bin/env bash
# The project's test command: fetch the real model and tokenizers, then lint and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/fetch_test_assets.sh)"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace 2>&1 | tee .cache/test.log
