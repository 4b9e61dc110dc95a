#!/usr/bin/env bash
# The project's test command: fetch the real model, tokenizers, the Python clients, headless
# Chromium and nginx, then lint, run every Rust test, and drive a real `vigil serve` with the
# openai and layerscale clients (open the benchmark report in Chromium, put three replicas
# behind nginx).
#
# The workspace is compiled once per profile: clippy (check), then the test build, whose
# integration tests also build the `vigil` binary the API tests run (no separate
# `cargo build`, which would unify features differently and rebuild the dependencies).
# Honours CARGO_TARGET_DIR. Without a system tool a test needs (Chromium, nginx), that test is
# skipped and this says so; under CI (CI=true) a missing tool fails the run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "== test.sh: $* ($(date +%T))" >&2; }
step "fetching the test model and tokenizers"
assets=$(scripts/fetch_test_assets.sh)
eval "$assets"
step "setting up the Python clients"
python_env=$(scripts/setup_python.sh)
eval "$python_env"
# A system tool some tests need, from its setup script; under CI a missing one fails the run.
optional_tool() {
  local name=$1 script=$2 skipped=$3 out
  step "setting up $name (for $skipped)"
  if out=$("scripts/$script"); then
    eval "$out"
  elif [ "${CI:-}" = true ]; then
    echo "test.sh: $name could not be installed (see above); CI needs it" >&2
    exit 1
  else
    echo "test.sh: no $name (see above): $skipped will be skipped" >&2
  fi
}
optional_tool Chromium setup_chromium.sh tests/api/test_bench_report.py
optional_tool nginx setup_nginx.sh tests/api/test_router.py
mkdir -p .cache
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test (builds the workspace and the vigil binary once)"
cargo test --workspace --lib --bins --tests 2>&1 | tee .cache/test.log
# Where the CPU has AMX the quantized GEMM runs on it by default; check the AVX-512 GEMM too.
VIGIL_AMX=0 cargo test -p vigil-kernels --test matmul_isa 2>&1 | tee -a .cache/test.log
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
export VIGIL_BIN="$target_dir/debug/vigil"
[ -x "$VIGIL_BIN" ] || { echo "test.sh: $VIGIL_BIN was not built by cargo test" >&2; exit 1; }
step "API tests against $VIGIL_BIN"
status=0
"$VIGIL_TEST_PYTHON" -m pytest tests/api -q -p no:cacheprovider 2>&1 | tee .cache/pytest.log || status=$?
# One closing line over every test binary and the API suite.
awk '/^test result:/ { p += $4; f += $6 } END { printf "rust tests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' .cache/test.log
tail -n 1 .cache/pytest.log | sed 's/^/api tests: /'
exit "$status"
