"""Several choices in one request: `n > 1` on chat and text completions, and a list of prompts
on completions. A prompt counts once in `usage`; its other choices start once the first has
computed the prompt, so they take its KV blocks from the prefix cache instead of computing it
again."""

from __future__ import annotations

import json
import time

import httpx

from conftest import prom_value
from test_openai_sdk import make_client


def cached_total(server) -> float:
    return prom_value(httpx.get(server.url + "/metrics", timeout=30).text, "vigil_prefix_cached_tokens_total")


def test_chat_n2_gives_two_choices_that_share_the_prompt(smol):
    client = make_client(smol)
    # A prompt no earlier test sent: its blocks cannot be cached already.
    unique = f"Request {time.time_ns()}: write a sentence about rivers, mountains and the long road home."
    msgs = [{"role": "user", "content": unique}]
    before = cached_total(smol)
    r = client.chat.completions.create(model="m", messages=msgs, n=2, max_tokens=12, temperature=1.0, seed=3,
                                       extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    one = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=1.0, seed=3,
                                         extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == one.usage.prompt_tokens, "the prompt counts once"
    assert r.usage.completion_tokens == 2 * 12
    assert r.choices[0].message.content == one.choices[0].message.content, "choice 0 keeps the seed"
    shared = cached_total(smol) - before
    # The second choice (and the single request after it) read the prompt's full 16-token
    # blocks from the cache.
    assert shared >= 2 * 16 * (r.usage.prompt_tokens // 16), shared


def test_completions_prompt_list_times_n(smol):
    prompts = ["The sky is", "Two plus two is"]
    r = httpx.post(f"{smol.v1}/completions", json={"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        alone = httpx.post(f"{smol.v1}/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}, timeout=60).json()
        # Greedy: both choices of a prompt are that prompt's own completion.
        assert choices[2 * p]["text"] == choices[2 * p + 1]["text"] == alone["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == sum(6 for _ in choices)
    single = [httpx.post(f"{smol.v1}/completions", json={"prompt": p, "max_tokens": 1}, timeout=60).json()["usage"]["prompt_tokens"] for p in prompts]
    assert body["usage"]["prompt_tokens"] == sum(single)


def test_chat_n2_streams_both_choices_by_index(smol):
    """Streamed choices: each chunk names its choice, the texts are the unstreamed choices'
    (same seeds), and the usage chunk counts the prompt once."""
    client = make_client(smol)
    msgs = [{"role": "user", "content": "Write a sentence about a quiet harbour at dawn."}]
    args = dict(model="m", messages=msgs, n=2, max_tokens=10, temperature=1.0, seed=11,
                extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    texts = {0: "", 1: ""}
    finishes = {}
    usage = None
    for chunk in client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 2 * 10
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_stream_a_prompt_list_times_n(smol):
    """Streamed prompt list × n: every choice's text is the unstreamed one's (greedy), each
    chunk names its choice, and the usage chunk counts each prompt once."""
    body = {"prompt": ["The sky is", "Two plus two is"], "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(f"{smol.v1}/completions", json=body, timeout=60).json()
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    with httpx.stream("POST", f"{smol.v1}/completions", json={**body, "stream": True,
                      "stream_options": {"include_usage": True}}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk["choices"]:
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
                if c["finish_reason"]:
                    finishes[c["index"]] = c["finish_reason"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert finishes == {i: "length" for i in range(4)}
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert usage["completion_tokens"] == 4 * 6
