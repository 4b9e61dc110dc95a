#!/usr/bin/env python3
"""How well llama.cpp agrees with itself on the SmolLM2 references
(tests/fixtures/smollm2/llamacpp_refs.json: flash attention off, one 64-token batch per prompt
for the teacher-forced logits, one-token decode steps for the greedy continuations).

First, how consistent the references are with themselves: along each greedy continuation,
the teacher-forced top-1 (batch numerics) against the next greedy token (decode numerics).
Then other shapes of the same llama.cpp, same weights, same threads:
  * the teacher-forced sequences fed one token per decode step (flash attention off);
  * the greedy continuations made with the references' batch numerics: every step
    re-evaluates prompt + continuation so far in one batch (flash attention off);
  * the teacher-forced sequences in one batch with flash attention on (llama-bench's and the
    server's CPU default);
  * the greedy continuations with flash attention on.
For each: top-1 agreement with the references and the |Δlogit| on their top-5, and greedy
continuations identical over 32 tokens: the noise floor that any other engine's agreement with
these references sits on.

Usage: /work/venv/bin/python scripts/llamacpp_self_agreement.py [--gguf PATH]
"""

import argparse
import json
import os
import statistics

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REFS = os.path.join(HERE, "..", "tests", "fixtures", "smollm2", "llamacpp_refs.json")


def open_llama(gguf, flash_attn):
    # The settings of scripts/make_llamacpp_refs.py, flash attention aside.
    return llama_cpp.Llama(
        gguf, n_ctx=512, n_threads=2, logits_all=True, seed=0, flash_attn=flash_attn, verbose=False
    )


def clear(llm):
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)


def teacher_forced(llm, cases, one_token_steps, label):
    agree = total = 0
    deltas = []
    for case in cases:
        seq = case["sequence_ids"]
        clear(llm)
        if one_token_steps:
            for tok in seq:
                llm.eval([tok])
        else:
            llm.eval(seq)
        scores = np.asarray(llm.scores[: len(seq)], dtype=np.float32)
        misses = []
        for i, pos in enumerate(case["positions"]):
            row = scores[i]
            deltas.extend(abs(float(row[t]) - l) for t, l in zip(pos["ids"], pos["logits"]))
            total += 1
            if int(np.argmax(row)) == pos["ids"][0]:
                agree += 1
            else:
                misses.append((i, round(pos["logits"][0] - pos["logits"][1], 3)))
        print(f"  {case['name']}: misses (position, reference margin): {misses}")
    q = statistics.quantiles(deltas, n=10)
    print(
        f"{label}: top-1 {agree}/{total} = {100 * agree / total:.2f}%; |Δlogit| on the "
        f"references' top-5: median {statistics.median(deltas):.3f}, p90 {q[-1]:.3f}, max {max(deltas):.3f}"
    )


def references_consistency(cases):
    agree = total = 0
    for case in cases:
        seq, first = case["sequence_ids"], len(case["prompt_ids"]) - 1
        for i in range(first, len(seq) - 1):
            total += 1
            agree += case["positions"][i]["ids"][0] == seq[i + 1]
    print(
        f"references: teacher-forced top-1 equals the next greedy token at {agree}/{total} "
        f"continuation positions"
    )


def greedy(llm, cases, label, whole_batch=False):
    same = 0
    for case in cases:
        clear(llm)
        llm.eval(case["prompt_ids"])
        out = []
        for _ in range(len(case["greedy_ids"])):
            tok = int(np.argmax(np.asarray(llm.scores[llm.n_tokens - 1])))
            out.append(tok)
            if whole_batch:
                clear(llm)
                llm.eval(case["prompt_ids"] + out)
            else:
                llm.eval([tok])
        step = next((i for i, (a, b) in enumerate(zip(out, case["greedy_ids"])) if a != b), None)
        same += step is None
        print(f"  {case['name']}: diverges at step {step}")
    print(f"{label}: identical greedy continuations {same}/{len(cases)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(HERE, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    cases = json.load(open(REFS))["cases"]
    print(f"llama-cpp-python {llama_cpp.__version__}")
    references_consistency(cases)
    llm = open_llama(args.gguf, flash_attn=False)
    teacher_forced(llm, cases, True, "one-token decode steps (flash attention off)")
    greedy(llm, cases, "greedy, whole sequence in one batch per step (flash attention off)", True)
    llm = open_llama(args.gguf, flash_attn=True)
    teacher_forced(llm, cases, False, "one batch, flash attention on")
    greedy(llm, cases, "greedy, flash attention on")


if __name__ == "__main__":
    main()
