"""Structured outputs through the real `openai` SDK: `response_format` (`text`, `json_object`,
`json_schema` via `chat.completions.parse` with pydantic models), vLLM's extras
(`structured_outputs`, `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`), a
constrained generation cut by `max_tokens`, and bad specs refused with a 400 naming the field.
The constraint is llguidance's (crates/vigil-engine/src/grammar.rs); the tiny Qwen3's weights are
random, so only the grammar stands between it and invalid output."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import openai
import pydantic
import pytest

from test_openai_sdk import make_client, target  # noqa: F401 (the fixture: both models)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    country: str = pydantic.Field(max_length=12)
    population_millions: int = pydantic.Field(ge=0, le=99)
    coastal: bool


class Verdict(pydantic.BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = pydantic.Field(ge=1, le=5)


def test_parse_with_a_pydantic_model_returns_a_valid_instance(target):
    client, model, _ = target
    for i, (schema, question) in enumerate(
        [(City, "Describe Lisbon as JSON."), (Verdict, "Is water wet? Answer as JSON.")]
    ):
        completion = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": question}],
            response_format=schema,
            max_tokens=120,
            temperature=0.7,
            seed=i,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice
        parsed = choice.message.parsed
        assert isinstance(parsed, schema), choice.message.content
        # The SDK validated it; check the text is the compact layout the grammar enforces.
        assert choice.message.content == json.dumps(json.loads(choice.message.content), ensure_ascii=False)


def test_json_object_output_parses_as_a_json_object(target):
    client, model, _ = target
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a JSON object describing a cat: its name and colour."}],
        response_format={"type": "json_object"},
        max_tokens=100,
        temperature=0,
    )
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict), c.message.content
    else:
        assert c.finish_reason == "length"
        assert c.message.content.startswith("{")


def test_response_format_text_changes_nothing(smol):
    client = make_client(smol)
    ask = dict(
        model="m", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
    )
    plain = client.chat.completions.create(**ask).choices[0].message.content
    text = client.chat.completions.create(**ask, response_format={"type": "text"}).choices[0].message.content
    assert plain == text


def test_streamed_constrained_output_is_whole_json(smol):
    client = make_client(smol)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is the sea salty? Answer as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": Verdict.model_json_schema(), "strict": True},
        },
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    Verdict.model_validate_json(text)


def test_vllm_guided_fields_constrain_chat_and_completions(target):
    client, model, _ = target
    msgs = [{"role": "user", "content": "Is the sky blue?"}]
    for body in [{"guided_choice": ["yes", "no", "maybe"]}, {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}]:
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, extra_body=body)
        assert r.choices[0].message.content in ("yes", "no", "maybe"), body
        assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model=model, prompt="Call me at", max_tokens=20, extra_body={"guided_regex": r" [0-9]{3}-[0-9]{4}"}
    )
    assert re.fullmatch(r" [0-9]{3}-[0-9]{4}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(
        model=model,
        prompt="A JSON list of two small numbers:",
        max_tokens=30,
        extra_body={"guided_json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}},
    )
    values = json.loads(r.choices[0].text)
    assert len(values) == 2 and all(0 <= v <= 9 for v in values)
    grammar = 'start: "ab" | "cd" x\nx: "!" | "?"'
    r = client.completions.create(model=model, prompt="Say:", max_tokens=10, extra_body={"guided_grammar": grammar})
    assert r.choices[0].text in ("ab", "cd!", "cd?")


def test_a_constrained_generation_cut_by_max_tokens_ends_with_length(target):
    client, model, _ = target
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe Lisbon."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": City.model_json_schema()}},
        max_tokens=4,
        temperature=0,
    )
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 4
    with pytest.raises(ValueError):
        json.loads(c.message.content)
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "Lisbon?"}], response_format=City, max_tokens=4
        )


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": 5}, "guided_json"),
        ({"guided_grammar": "start: nowhere"}, "guided_grammar"),
        ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
    ],
)
def test_bad_structured_output_specs_are_400_naming_the_field(smol, extra, param):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = httpx.post(f"{smol.v1}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err


def test_structured_output_with_a_forced_tool_call_is_refused(qwen):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "tool_choice": "required",
        "response_format": {"type": "json_object"},
        "max_tokens": 8,
    }
    r = httpx.post(f"{qwen.v1}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format"


def test_fields_the_sdks_send_are_accepted(smol):
    """Known OpenAI fields that change nothing here are accepted (docs/api.md lists them);
    a truly unknown field is still refused by name."""
    client = make_client(smol)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        store=False,
        metadata={"k": "v"},
        service_tier="auto",
        prompt_cache_key="conversation-1",
        safety_identifier="user-1",
        verbosity="low",
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    assert sum(1 for _ in r) > 1
    r = client.completions.create(
        model="m", prompt="hi", max_tokens=4,
        extra_body={"store": False, "metadata": {"k": "v"}, "service_tier": "auto",
                    "prompt_cache_key": "p", "safety_identifier": "s"},
    )
    assert r.choices[0].finish_reason == "length"
    bad = httpx.post(f"{smol.v1}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "colour": 1}, timeout=60)
    assert bad.status_code == 400 and "colour" in bad.text


def test_anthropic_fields_are_accepted_and_top_k_applied(smol):
    """Anthropic's `service_tier` and top-level `cache_control` are accepted (ignored);
    `top_k` is applied: at top_k 1 a hot sampler gives the greedy answer whatever the seed."""
    base = {"model": "m", "max_tokens": 12, "messages": [{"role": "user", "content": "Name three fruits."}]}
    greedy = httpx.post(f"{smol.url}/v1/messages", json={**base, "temperature": 0}, timeout=60)
    assert greedy.status_code == 200, greedy.text
    want = greedy.json()["content"][0]["text"]
    for seed in range(3):
        body = {**base, "temperature": 1.0, "top_k": 1, "seed": seed, "service_tier": "auto",
                "cache_control": {"type": "ephemeral"}}
        r = httpx.post(f"{smol.url}/v1/messages", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["text"] == want
