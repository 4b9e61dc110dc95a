#!/usr/bin/env python3
"""How well llama.cpp agrees with itself on the Gemma 3 references
(tests/fixtures/gemma3/llamacpp_refs.json: greedy continuations made one decode step at a time
by a natively built llama-server, flash attention at its default).

Each reference step is re-evaluated by the same llama.cpp build, same file, same threads, along
other paths, and its most likely token compared with the reference's greedy token there
(teacher-forced top-1, the figure tests/api/test_gemma3.py holds Vigil to):
  * batch:        prompt + continuation so far evaluated in one batch (no prompt cache);
  * batch, fa off / fa on: the same with flash attention forced off / on;
  * decode, fa off: one token per step on the cached prefix, flash attention off.
The lowest of these is llama.cpp's own cross-path agreement: the noise floor that any other
engine's agreement with these references sits on. Writes it into the references file
(`self_agreement`).

Usage: LLAMACPP_BIN=... .cache/venv/bin/python scripts/llamacpp_self_agreement_gemma.py [GGUF]
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parent.parent
REFS = REPO / "tests" / "fixtures" / "gemma3" / "llamacpp_refs.json"
PORT = 18731
URL = f"http://127.0.0.1:{PORT}"


def start(gguf: str, fa: str) -> subprocess.Popen:
    server = os.path.join(os.environ["LLAMACPP_BIN"], "llama-server")
    # The settings of scripts/make_gemma_llamacpp_refs.py, flash attention aside.
    args = [server, "-m", gguf, "--port", str(PORT), "-t", "2", "-c", "4096", "-np", "1"]
    if fa:
        args += ["-fa", fa]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(URL + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama-server did not become ready")


def top1(prefix: list[int], cache_prompt: bool) -> int:
    r = httpx.post(URL + "/completion", timeout=600, json={
        "prompt": prefix, "n_predict": 1, "temperature": 0, "top_k": 1, "cache_prompt": cache_prompt,
        "n_probs": 1, "post_sampling_probs": False,
    })
    r.raise_for_status()
    return r.json()["completion_probabilities"][0]["id"]


def agreement(cases, cache_prompt: bool) -> tuple[int, int]:
    agree = total = 0
    for case in cases:
        if cache_prompt:
            # Evaluate the prompt once, so that every later request adds one token to the cache.
            top1(case["ids"][:-1], True)
        for i, want in enumerate(case["greedy"]):
            total += 1
            agree += top1(case["ids"] + case["greedy"][:i], cache_prompt) == want
    return agree, total


def main() -> None:
    gguf = sys.argv[1] if len(sys.argv) > 1 else str(REPO / ".cache" / "gemma-3-270m-q4_k_m.gguf")
    refs = json.loads(REFS.read_text())
    paths = [("batch", "", False), ("batch, fa off", "off", False), ("batch, fa on", "on", False),
             ("decode, fa off", "off", True)]
    results = {}
    for name, fa, cache_prompt in paths:
        proc = start(gguf, fa)
        try:
            agree, total = agreement(refs["cases"], cache_prompt)
        finally:
            proc.terminate()
            proc.wait()
        results[name] = [agree, total]
        print(f"{name}: top-1 {agree}/{total} = {100 * agree / total:.2f}%", flush=True)
    lowest = min(results.values(), key=lambda at: at[0] / at[1])
    refs["self_agreement"] = {
        "about": "teacher-forced top-1 of the same llama.cpp build along other paths against these "
                 "references (scripts/llamacpp_self_agreement_gemma.py); `lowest` is the bar",
        "paths": results,
        "lowest": lowest,
    }
    REFS.write_text(json.dumps(refs, indent=1) + "\n")
    print(f"lowest: {lowest[0]}/{lowest[1]}; wrote {REFS}")


if __name__ == "__main__":
    main()
