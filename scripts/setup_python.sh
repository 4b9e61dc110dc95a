#!/usr/bin/env bash
# Creates (once) the virtual environments the API tests use, with pinned packages, and prints
# the variables the tests read:
#   eval "$(scripts/setup_python.sh)"   →   VIGIL_TEST_PYTHON=<abs path to .cache/venv's python>
#                                           VIGIL_TEST_AGENTS_PYTHON=<… .cache/venv-agents's>
# .cache/venv holds tests/api/requirements.txt (pytest and every client but one);
# .cache/venv-agents holds tests/api/requirements-agents.txt (openai-agents, whose websockets pin
# conflicts with layerscale's). A stamp file per venv, keyed on its requirements and the
# interpreter, makes a second run a no-op. Only the export lines go to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

command -v "$python" >/dev/null || { echo "setup_python: $python not found" >&2; exit 1; }
# Debian splits venv/ensurepip out of python3; without them `python3 -m venv` fails half-way.
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup_python: $python lacks the venv/ensurepip modules." >&2
  echo "  Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv for your version)" >&2
  exit 1
fi

# make_venv DIR REQUIREMENTS: create or update DIR from the pinned REQUIREMENTS.
make_venv() {
  local venv=$1 requirements=$2 stamp key
  stamp="$venv/.requirements.sha256"
  key=$({ cat "$requirements"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
    return 0
  fi
  echo "setup_python: installing $(grep -cv '^\s*\(#\|$\)' "$requirements") pinned packages into $venv" >&2
  rm -f "$stamp"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
  # Not quiet: pip's lines are the progress of an install that takes minutes.
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -r "$requirements" >&2
  echo "$key" >"$stamp"
}

make_venv "$root/.cache/venv" "$root/tests/api/requirements.txt"
make_venv "$root/.cache/venv-agents" "$root/tests/api/requirements-agents.txt"
echo "export VIGIL_TEST_PYTHON=$root/.cache/venv/bin/python"
echo "export VIGIL_TEST_AGENTS_PYTHON=$root/.cache/venv-agents/bin/python"
