#!/usr/bin/env python3
"""Dump llama.cpp's intermediate tensors for one teacher-forced case of llamacpp_refs.json.

Same settings as scripts/make_llamacpp_refs.py (n_ctx 512, 2 threads, logits_all, no flash
attention, f16 KV cache, the 64-token sequence in one batch), with ggml's eval callback
(`cb_eval`) copying every named graph node (`attn_norm-0`, `Qcur-0`, `kq_soft_max-0`, ...)
to host memory. A name that appears several times in the graph (e.g. `Qcur-0` after the
projection, the reshape and RoPE) is saved as `name#0`, `name#1`, ... in graph order.

Writes an .npz whose arrays are shaped as ggml's `ne` reversed (numpy row-major order).

Usage: /work/venv/bin/python scripts/dump_llamacpp_tensors.py CASE OUT.npz [--gguf PATH]
"""

import argparse
import ctypes
import json
import os

import llama_cpp
import llama_cpp.llama_cpp as ll
import numpy as np

REFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "smollm2", "llamacpp_refs.json")
GGUF = "/work/main/.cache/SmolLM2-135M-Instruct.Q4_1.gguf"


class TensorHead(ctypes.Structure):
    """The stable leading fields of `struct ggml_tensor` (type, buffer, ne[4], nb[4])."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("out")
    ap.add_argument("--gguf", default=GGUF)
    args = ap.parse_args()

    refs = json.load(open(REFS, encoding="utf-8"))
    case = next(c for c in refs["cases"] if c["name"] == args.case)
    seq = case["sequence_ids"]

    base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    base.ggml_get_name.restype = ctypes.c_char_p
    base.ggml_get_name.argtypes = [ctypes.c_void_p]
    base.ggml_nbytes.restype = ctypes.c_size_t
    base.ggml_nbytes.argtypes = [ctypes.c_void_p]
    base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    base.ggml_backend_tensor_get.restype = None

    dumps = {}
    counts = {}
    recording = {"on": False}

    def on_tensor(t, ask, _user):
        if ask:
            return True
        if not recording["on"]:
            return True
        head = TensorHead.from_address(t)
        if head.type not in (llama_cpp.GGML_TYPE_F32, llama_cpp.GGML_TYPE_F16):
            return True
        name = base.ggml_get_name(t).decode()
        nbytes = base.ggml_nbytes(t)
        raw = ctypes.create_string_buffer(nbytes)
        base.ggml_backend_tensor_get(t, raw, 0, nbytes)
        dt = np.float32 if head.type == llama_cpp.GGML_TYPE_F32 else np.float16
        flat = np.frombuffer(raw.raw, dtype=dt)
        esz = flat.itemsize
        ne = list(head.ne)
        nb = list(head.nb)
        arr = np.lib.stride_tricks.as_strided(
            flat, shape=ne[::-1], strides=[s for s in nb[::-1]]
        ).astype(np.float32)
        assert all(s % esz == 0 for s in nb)
        k = counts.get(name, 0)
        counts[name] = k + 1
        dumps[f"{name}#{k}"] = arr
        return True

    cb = ll.ggml_backend_sched_eval_callback(on_tensor)
    orig = ll.llama_context_default_params

    def params_with_cb():
        p = orig()
        p.cb_eval = cb
        p.cb_eval_user_data = None
        return p

    ll.llama_context_default_params = params_with_cb
    llm = llama_cpp.Llama(args.gguf, n_ctx=512, n_threads=2, logits_all=True, seed=0, flash_attn=False, verbose=False)
    ll.llama_context_default_params = orig

    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    recording["on"] = True
    llm.eval(seq)
    recording["on"] = False
    scores = np.asarray(llm.scores[: len(seq)], dtype=np.float32)
    dumps["scores"] = scores
    # Sanity: the callback run must give the reference logits.
    ref_top = [p["ids"][0] for p in case["positions"]]
    agree = sum(int(np.argmax(r) == t) for r, t in zip(scores, ref_top))
    print(f"{args.case}: top-1 equal to the refs at {agree}/{len(seq)}; {len(dumps)} tensors")
    np.savez(args.out, seq=np.array(seq), **dumps)


if __name__ == "__main__":
    main()
