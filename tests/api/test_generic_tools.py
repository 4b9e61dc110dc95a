"""Tools on a chat template without a tool-call format (SmolLM2's): the tools and the Hermes
call syntax go into the system message, earlier calls and results become plain turns, and the
output is parsed in that syntax (crates/vigil-server/src/generic_tools.rs). Never a silent drop."""

from __future__ import annotations

import json

import httpx

from test_openai_sdk import make_client

WEATHER = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_auto_tools_reach_the_prompt(smol):
    client = make_client(smol)
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=1)
    with_tools = client.chat.completions.create(model="m", messages=ASK, tools=WEATHER, max_tokens=1)
    # The tools block (the function's JSON and the call syntax) is ~140 tokens.
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 100
    r = httpx.post(f"{smol.url}/v1/chat/completions/render", json={"messages": ASK, "tools": WEATHER}, timeout=30)
    if r.status_code == 200:  # where the server offers a render route, the block is visible
        assert "get_weather" in json.dumps(r.json())


def test_a_forced_call_is_parsed_in_the_generic_syntax(smol):
    client = make_client(smol)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(
            model="m", messages=ASK, tools=WEATHER, tool_choice=choice, max_tokens=40, temperature=0
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        (call,) = c.message.tool_calls
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments).get("city"), str)


def test_a_tool_round_trip_renders_and_answers(smol):
    client = make_client(smol)
    first = client.chat.completions.create(
        model="m", messages=ASK, tools=WEATHER, tool_choice="required", max_tokens=40, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    r = client.chat.completions.create(model="m", messages=history, tools=WEATHER, max_tokens=24, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    # The earlier call and its result are in the prompt: more than the first request's.
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 10
    assert r.usage.prompt_tokens_details.cached_tokens > 0, "the shared prefix is reused"


def test_anthropic_tool_use_on_a_template_without_tools(smol):
    body = {
        "model": "m", "max_tokens": 40, "temperature": 0, "messages": ASK,
        "tools": [{"name": "get_weather", "description": "Get the weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any"},
    }
    r = httpx.post(f"{smol.url}/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["stop_reason"] == "tool_use", m
    uses = [b for b in m["content"] if b["type"] == "tool_use"]
    assert len(uses) == 1 and uses[0]["name"] == "get_weather" and isinstance(uses[0]["input"], dict)
