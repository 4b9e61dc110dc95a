"""Assistant prefill: vLLM's `continue_final_message` (with `add_generation_prompt: false`) on
chat completions and Anthropic's trailing assistant message continue that message instead of
closing it and opening a new turn. The continuation equals a raw completion of the rendered
conversation cut right after the prefill's text."""

from __future__ import annotations

import httpx

PREFILL = "The first five prime numbers are 2, 3,"
MSGS = [{"role": "user", "content": "List the first five prime numbers."}, {"role": "assistant", "content": PREFILL}]


def raw_continuation(server, max_tokens: int) -> str:
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": MSGS, "add_generation_prompt": False}, timeout=30).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]
    cut = text[: text.rindex(PREFILL) + len(PREFILL)]
    assert len(cut) < len(text), "the closed turn has an end after the prefill"
    r = httpx.post(f"{server.v1}/completions", json={"prompt": cut, "max_tokens": max_tokens, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_chat_continue_final_message_continues_the_prefill(smol):
    want = raw_continuation(smol, 8)
    body = {"messages": MSGS, "max_tokens": 8, "temperature": 0, "continue_final_message": True,
            "add_generation_prompt": False}
    r = httpx.post(f"{smol.v1}/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want
    closed = httpx.post(f"{smol.v1}/chat/completions", json={"messages": MSGS, "max_tokens": 8, "temperature": 0}, timeout=60)
    assert closed.json()["usage"]["prompt_tokens"] > r.json()["usage"]["prompt_tokens"], "a new turn was not opened"


def test_anthropic_trailing_assistant_message_is_a_prefill(smol):
    want = raw_continuation(smol, 8)
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "messages": MSGS}
    r = httpx.post(f"{smol.url}/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == want


def test_bad_continuations_are_400(smol):
    user_last = {"messages": MSGS[:1], "max_tokens": 4, "continue_final_message": True, "add_generation_prompt": False}
    both = {"messages": MSGS, "max_tokens": 4, "continue_final_message": True, "add_generation_prompt": True}
    for body, param in [(user_last, "messages"), (both, "add_generation_prompt")]:
        r = httpx.post(f"{smol.v1}/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
