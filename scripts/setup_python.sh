#!/usr/bin/env bash
# Creates (once) the virtual environment .cache/venv with the pinned packages of
# tests/api/requirements.txt, and prints the variable the API tests read:
#   eval "$(scripts/setup_python.sh)"   →   VIGIL_TEST_PYTHON=<abs path to the venv's python>
# A stamp file keyed on the requirements and the interpreter makes a second run a no-op.
# Only the export line goes to stdout; everything else goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
requirements="$root/tests/api/requirements.txt"
venv="$root/.cache/venv"
python=${PYTHON:-python3}
stamp="$venv/.requirements.sha256"

command -v "$python" >/dev/null || { echo "setup_python: $python not found" >&2; exit 1; }
# Debian splits venv/ensurepip out of python3; without them `python3 -m venv` fails half-way.
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup_python: $python lacks the venv/ensurepip modules." >&2
  echo "  Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv for your version)" >&2
  exit 1
fi

key=$({ cat "$requirements"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  echo "export VIGIL_TEST_PYTHON=$venv/bin/python"
  exit 0
fi

echo "setup_python: installing $(grep -cv '^\s*\(#\|$\)' "$requirements") pinned packages into $venv" >&2
rm -f "$stamp"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
# Not quiet: pip's lines are the progress of an install that takes minutes.
"$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -r "$requirements" >&2
echo "$key" >"$stamp"
echo "export VIGIL_TEST_PYTHON=$venv/bin/python"
