#!/usr/bin/env bash
# Installs (once) the headless Chromium that tests/api/test_bench_report.py opens the benchmark
# report in, and prints the variable that test reads:
#   eval "$(scripts/setup_chromium.sh)"   →   VIGIL_TEST_CHROMIUM=<path to the chromium binary>
set -euo pipefail
exec "$(dirname "$0")/setup_apt_tool.sh" VIGIL_TEST_CHROMIUM chromium /usr/bin/chromium /usr/bin/chromium-browser
