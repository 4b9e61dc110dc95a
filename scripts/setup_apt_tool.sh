#!/usr/bin/env bash
# Installs (once) a Debian package that a test needs and prints the variable that test reads:
#   scripts/setup_apt_tool.sh VAR PACKAGE BINARY...   →   export VAR=<the first BINARY found>
# A no-op when $VAR or one of the BINARY paths is already executable. Debian/Ubuntu only
# (apt-get, as root or through sudo; the package lists are refreshed only when the install cannot
# find the package). Only the export line goes to stdout; everything else goes to stderr.
set -euo pipefail
var=$1 package=$2
shift 2

found() {
  local c
  for c in "${!var:-}" "$@"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if bin=$(found "$@"); then
  echo "export $var=$bin"
  exit 0
fi

command -v apt-get >/dev/null || { echo "setup: no apt-get; install $package and export $var" >&2; exit 1; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to apt-get install $package" >&2; exit 1; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
apt() { $sudo apt-get -q -y -o Dpkg::Use-Pty=0 "$@" >&2; }
echo "setup: installing $package with apt-get" >&2
start=$SECONDS
apt install --no-install-recommends "$package" || { apt update && apt install --no-install-recommends "$package"; }
bin=$(found "$@") || { echo "setup: apt-get installed $package but none of $* is there" >&2; exit 1; }
echo "setup: $package installed in $((SECONDS - start)) s ($bin)" >&2
echo "export $var=$bin"
