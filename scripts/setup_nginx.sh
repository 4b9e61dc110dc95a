#!/usr/bin/env bash
# Installs (once) Debian's nginx, which tests/api/test_router.py puts in front of three Vigil
# replicas with deploy/nginx.conf, and prints the variable that test reads:
#   eval "$(scripts/setup_nginx.sh)"   →   VIGIL_TEST_NGINX=<path to the nginx binary>
# Debian/Ubuntu only (apt-get, as root or through sudo); a no-op when nginx is already there.
# The package's own service is stopped: the test runs its own nginx on a loopback port.
# Only the export line goes to stdout; everything else goes to stderr.
set -euo pipefail

found() {
  local c
  for c in "${VIGIL_TEST_NGINX:-}" /usr/sbin/nginx; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if bin=$(found); then
  echo "export VIGIL_TEST_NGINX=$bin"
  exit 0
fi

command -v apt-get >/dev/null || { echo "setup_nginx: no apt-get; install nginx and export VIGIL_TEST_NGINX" >&2; exit 1; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup_nginx: need root (or sudo) to apt-get install nginx" >&2; exit 1; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
apt() { $sudo apt-get -q -y -o Dpkg::Use-Pty=0 "$@" >&2; }
echo "setup_nginx: installing nginx with apt-get" >&2
start=$SECONDS
apt install --no-install-recommends nginx || { apt update && apt install --no-install-recommends nginx; }
# Installing may start the packaged service on port 80; the tests do not use it.
$sudo service nginx stop >&2 2>/dev/null || $sudo /usr/sbin/nginx -s quit 2>/dev/null || true
bin=$(found) || { echo "setup_nginx: apt-get installed nginx but no binary at /usr/sbin/nginx" >&2; exit 1; }
echo "setup_nginx: $("$bin" -v 2>&1) installed in $((SECONDS - start)) s" >&2
echo "export VIGIL_TEST_NGINX=$bin"
