#!/usr/bin/env bash
# Installs (once) the headless Chromium that tests/api/test_bench_report.py opens the benchmark
# report in, and prints the variable that test reads:
#   eval "$(scripts/setup_chromium.sh)"   →   VIGIL_TEST_CHROMIUM=<path to the chromium binary>
# Debian/Ubuntu only (apt-get, as root or through sudo); a no-op when Chromium is already there.
# Only the export line goes to stdout; everything else goes to stderr.
set -euo pipefail

found() {
  local c
  for c in "${VIGIL_TEST_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if bin=$(found); then
  echo "export VIGIL_TEST_CHROMIUM=$bin"
  exit 0
fi

command -v apt-get >/dev/null || { echo "setup_chromium: no apt-get; install Chromium and export VIGIL_TEST_CHROMIUM" >&2; exit 1; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup_chromium: need root (or sudo) to apt-get install chromium" >&2; exit 1; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
apt() { $sudo apt-get -q -y -o Dpkg::Use-Pty=0 "$@" >&2; }
echo "setup_chromium: installing chromium with apt-get" >&2
start=$SECONDS
# A fresh container has no package lists; refresh them only when the install cannot find chromium.
apt install --no-install-recommends chromium || { apt update && apt install --no-install-recommends chromium; }
bin=$(found) || { echo "setup_chromium: apt-get installed chromium but no binary at /usr/bin/chromium" >&2; exit 1; }
echo "setup_chromium: $("$bin" --version 2>/dev/null || echo chromium) installed in $((SECONDS - start)) s" >&2
echo "export VIGIL_TEST_CHROMIUM=$bin"
