#!/usr/bin/env bash
# Installs (once) Debian's nginx, which tests/api/test_router.py puts in front of three Vigil
# replicas with deploy/nginx.conf, and prints the variable that test reads:
#   eval "$(scripts/setup_nginx.sh)"   →   VIGIL_TEST_NGINX=<path to the nginx binary>
# The package's own service is stopped: the test runs its own nginx on a loopback port.
set -euo pipefail
had=$([ -x /usr/sbin/nginx ] && echo yes || echo no)
out=$("$(dirname "$0")/setup_apt_tool.sh" VIGIL_TEST_NGINX nginx /usr/sbin/nginx)
if [ "$had" = no ]; then
  # Installing may start the packaged service on port 80; the tests do not use it.
  { service nginx stop || /usr/sbin/nginx -s quit || true; } >&2 2>/dev/null
fi
echo "$out"
