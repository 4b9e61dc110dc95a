#!/usr/bin/env python3
"""Reference greedy continuations of Gemma 3 270M Q4_K_M from llama.cpp, for
tests/api/test_gemma3.py.

For each prompt: its ids as llama.cpp tokenizes them (BOS added, special tokens parsed), and
64 greedy tokens with llama.cpp's two most likely tokens and their log-probabilities at each
step (`n_probs: 2`, before sampling), from a natively built `llama-server` on the file
(scripts/setup_llamacpp.sh):

    llama-server -m .cache/gemma-3-270m-q4_k_m.gguf --port 18721 -t 2 -c 4096 -np 1
    python scripts/make_gemma_llamacpp_refs.py http://127.0.0.1:18721

Writes tests/fixtures/gemma3/llamacpp_refs.json (token ids and numbers only; the model's
licence keeps its files out of the repository).
"""

import json
import pathlib
import sys

import httpx

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "The theory of relativity states that",
    "In 1492, Columbus",
    "import numpy as np\nimport",
    "The quick brown fox",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
]
STEPS = 64
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3" / "llamacpp_refs.json"


def main(url: str) -> None:
    props = httpx.get(url + "/props").json()
    cases = []
    for text in PROMPTS:
        ids = httpx.post(url + "/tokenize", json={"content": text, "add_special": True, "parse_special": True}).json()["tokens"]
        r = httpx.post(url + "/completion", timeout=600, json={
            "prompt": ids, "n_predict": STEPS, "temperature": 0, "top_k": 1, "cache_prompt": False,
            "n_probs": 2, "post_sampling_probs": False, "ignore_eos": True,
        }).json()
        steps = r["completion_probabilities"]
        cases.append({
            "prompt": text,
            "ids": ids,
            "greedy": [s["id"] for s in steps],
            "top2": [[[t["id"], t["logprob"]] for t in s["top_logprobs"][:2]] for s in steps],
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"llama_cpp_build": props.get("build_info"), "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
