#!/usr/bin/env bash
# Builds llama.cpp natively from the sources inside the PyPI sdist of llama-cpp-python (its
# `vendor/llama.cpp`), Release, -DGGML_NATIVE=ON, the targets the benchmarks use, and prints
# where they are:
#   eval "$(scripts/setup_llamacpp.sh)"   →   LLAMACPP_BIN=<dir with llama-bench, llama-server,
#                                              llama-quantize, llama-perplexity>
# The build is cached outside the repo ($LLAMACPP_CACHE, default ~/.cache/vigil-peers), keyed on
# the version and this CPU's flags (a native build is only valid on the CPU it was made for).
# cmake comes from PyPI when the machine has none. Only the export line goes to stdout.
# Takes ~15-20 minutes on 2 cores the first time.
set -euo pipefail
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
cache=${LLAMACPP_CACHE:-$HOME/.cache/vigil-peers}
python=${PYTHON:-python3}
flags_key=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
# LLAMACPP_AMX=1 builds with AMX where the CPU lists it (see below); the default leaves it off.
amx=${LLAMACPP_AMX:-0}
if [ "$amx" = 1 ]; then variant=amx; else variant=noamx; fi
# LLAMACPP_MAX_ISA=avx2 builds for AVX2/FMA/F16C/BMI2 only (what an AMD Zen 3 has) instead of
# -march=native: on an AVX-512 machine it times llama.cpp's AVX2 path, the peer to run beside
# Vigil capped the same way (VIGIL_MAX_ISA=avx2).
max_isa=${LLAMACPP_MAX_ISA:-native}
if [ "$max_isa" = avx2 ]; then variant=avx2; fi
dir="$cache/llama.cpp-$version-$flags_key-$variant"
targets=(llama-bench llama-server llama-quantize llama-perplexity)
done_all() { for t in "${targets[@]}"; do [ -x "$dir/bin/$t" ] || return 1; done; }
if done_all; then
  echo "export LLAMACPP_BIN=$dir/bin"
  exit 0
fi
mkdir -p "$cache"
tools="$cache/tools-venv"
if ! command -v cmake >/dev/null; then
  [ -x "$tools/bin/cmake" ] || { "$python" -m venv "$tools" >&2 && "$tools/bin/pip" install --disable-pip-version-check -q cmake ninja >&2; }
  export PATH="$tools/bin:$PATH"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup_llamacpp: fetching the llama-cpp-python==$version sdist" >&2
"$python" -m pip download --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
  "llama-cpp-python==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "setup_llamacpp: no vendor/llama.cpp in the sdist" >&2; exit 1; }
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
echo "setup_llamacpp: building ${targets[*]} natively ($(nproc) jobs)" >&2
# AMX stays off by default even where /proc/cpuinfo lists it: on the Xeon VMs here its tile
# path faults on every matmul (general protection fault at the `ldtilecfg` in
# ggml_backend_amx_mul_mat), even on a VM that grants the tile state to a test program
# (docs/benchmarks.md, 2026-12-05). LLAMACPP_AMX=1 builds it with AMX, to check again on
# another machine. Explicit -mno-* flags win over what -march=native implies.
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$amx" = 1 ]; then noamx=""; fi
isa=(-DGGML_NATIVE=ON)
if [ "$max_isa" = avx2 ]; then
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
       -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF)
  noamx=""
fi
cmake -S "$src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$work/build" -j "$(nproc)" --target "${targets[@]}" >&2
rm -rf "$dir"
mkdir -p "$dir/bin"
for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$dir/bin/"; done
# What was built, for the result files.
"$dir/bin/llama-server" --version >"$dir/VERSION" 2>&1 || true
grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- >"$dir/CPU"
echo "export LLAMACPP_BIN=$dir/bin"
