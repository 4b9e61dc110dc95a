"""`POST /tokenize` and `/detokenize` (vLLM's shape) on SmolLM2: counts equal what the generation
routes report as `usage.prompt_tokens` for the same prompt or conversation (tools included), ids
round-trip to text, and bad input is a 400 naming the field."""

from __future__ import annotations

import httpx
import pytest

from test_bad_input import check_error

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def usage_of(server, path: str, body: dict) -> int:
    r = post(server, path, {**body, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_prompt_count_equals_completion_usage(smol):
    text = "The quick brown fox jumps over the lazy dog, twice: ÿ and 日本語."
    r = post(smol, "/tokenize", {"model": "x", "prompt": text})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["count"] == len(j["tokens"]) == usage_of(smol, "/v1/completions", {"prompt": text})
    assert j["max_model_len"] > 0
    bare = post(smol, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    # Without special tokens the text's own ids are the same, BOS (if the model adds one) dropped.
    assert bare["tokens"] == j["tokens"][len(j["tokens"]) - len(bare["tokens"]):]
    back = post(smol, "/detokenize", {"tokens": bare["tokens"]})
    assert back.status_code == 200, back.text
    assert back.json()["prompt"] == text


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
def test_messages_count_equals_chat_usage(smol, tools):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    r = post(smol, "/tokenize", body)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == usage_of(smol, "/v1/chat/completions", body)
    without = post(smol, "/tokenize", {**body, "add_generation_prompt": False}).json()
    assert 0 < without["count"] < r.json()["count"]
    assert r.json()["tokens"][:without["count"]] == without["tokens"]


@pytest.mark.parametrize("body, names", [
    ({}, ("prompt",)),
    ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, ("prompt", "messages")),
    ({"prompt": 5}, ("prompt",)),
    ({"prompt": "a", "add_generation_prompt": True}, ("add_generation_prompt",)),
    ({"messages": [{"role": "user", "content": "b"}], "add_special_tokens": True}, ("add_special_tokens",)),
    ({"messages": [{"role": "wizard", "content": "b"}]}, ("role", "messages")),
    ({"prompt": "a", "temperature": 0}, ("temperature",)),
])
def test_bad_tokenize_requests(smol, body, names):
    check_error(post(smol, "/tokenize", body), "/tokenize", 400, names)


@pytest.mark.parametrize("body, names", [
    ({}, ("tokens",)),
    ({"tokens": [1, -2]}, ("tokens",)),
    ({"tokens": [10**9]}, ("tokens", "vocabulary")),
])
def test_bad_detokenize_requests(smol, body, names):
    check_error(post(smol, "/detokenize", body), "/detokenize", 400, names)
