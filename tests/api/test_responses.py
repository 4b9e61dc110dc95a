"""OpenAI's Responses API through the real `openai` SDK: `responses.create` and `responses.stream`
(the event sequence the SDK's accumulator checks), instructions, a function tool round trip,
`previous_response_id` continuing on the chain's held KV (reported as cached tokens), structured
output (`responses.parse`), cuts by `max_output_tokens`, stored responses (retrieve, input items,
delete, expiry, `store: false`) and bad input refused with a 400 naming the field."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pydantic
import pytest

from conftest import start_server
from test_openai_sdk import make_client, target  # noqa: F401 (the fixture: both models)

WEATHER = [{
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}]


@pytest.fixture(scope="module")
def smol(gguf):
    """A server of this module's own: stored responses hold their chains' KV for an hour, and
    the shared server's tests expect every page free when idle."""
    server = start_server("responses", gguf, "--kv-memory", "256MiB")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(smol):
    c = make_client(smol)
    yield c, c.models.list().data[0].id
    c.close()


def chat_text(c: openai.OpenAI, model: str, messages: list[dict], max_tokens: int) -> str:
    r = c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def test_create_answers_as_the_chat_path_does(client):
    c, model = client
    r = c.responses.create(model=model, input="Name three colours.", max_output_tokens=24, temperature=0)
    assert r.object == "response" and r.id.startswith("resp")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == chat_text(c, model, [{"role": "user", "content": "Name three colours."}], 24)
    assert r.usage.output_tokens == 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_instructions_are_a_system_message(client):
    c, model = client
    r = c.responses.create(
        model=model, instructions="You answer in French.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
        max_output_tokens=16, temperature=0,
    )
    assert r.instructions == "You answer in French."
    expected = chat_text(c, model, [{"role": "system", "content": "You answer in French."},
                                    {"role": "user", "content": "Say hello."}], 16)
    assert r.output_text == expected


def test_stream_events_build_the_same_response(client):
    c, model = client
    kinds, deltas = [], []
    with c.responses.stream(model=model, input="Say hi in one short sentence.",
                            max_output_tokens=200, temperature=0) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        final = s.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert len(deltas) > 1 and final.status == "completed"
    assert "".join(deltas) == final.output_text
    whole = c.responses.create(model=model, input="Say hi in one short sentence.",
                               max_output_tokens=200, temperature=0)
    assert whole.output_text == final.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_sequence_numbers_count_up_and_a_cut_ends_incomplete(smol, client):
    c, model = client
    with httpx.stream("POST", smol.v1 + "/responses", timeout=60, json={
        "model": model, "input": "Tell me a story.", "max_output_tokens": 8, "stream": True,
    }) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = []
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 8


def test_previous_response_id_continues_on_held_kv(client):
    c, model = client
    first = c.responses.create(model=model, input="Name three colours.", max_output_tokens=20, temperature=0)
    second = c.responses.create(model=model, previous_response_id=first.id, input="And three animals?",
                                max_output_tokens=20, temperature=0)
    assert second.previous_response_id == first.id
    # The second prompt holds the first turn: its prompt, its answer and the new question.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # All of the first turn's tokens but the last generated one come from the chain's KV.
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens + first.usage.output_tokens - 1, second.usage
    # And it answers as a chat request replaying the conversation does.
    replay = chat_text(c, model, [
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And three animals?"},
    ], 20)
    assert second.output_text == replay


def test_function_tool_round_trip(client):
    c, model = client
    r = c.responses.create(model=model, input="What is the weather in Paris?", tools=WEATHER,
                           tool_choice="required", max_output_tokens=80, temperature=0)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    follow = c.responses.create(
        model=model, previous_response_id=r.id, tools=WEATHER, max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
    )
    assert follow.status in ("completed", "incomplete")
    # The chain's KV covers the first prompt but the forced call's opening, which the replayed
    # assistant turn renders with its own few tokens.
    assert follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 4, follow.usage
    items = c.responses.input_items.list(follow.id).data
    assert [i.type for i in items] == ["function_call_output"]


def test_a_streamed_call_arrives_as_argument_deltas(client):
    c, model = client
    with c.responses.stream(model=model, input="Weather in Oslo?", tools=WEATHER,
                            tool_choice={"type": "function", "name": "get_weather"},
                            max_output_tokens=80, temperature=0) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    call = [o for o in final.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)


def test_a_cut_forced_call_is_incomplete_not_a_finished_call(client):
    c, model = client
    r = c.responses.create(model=model, input="Weather in Paris?", tools=WEATHER, tool_choice="required",
                           max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert all(o.status == "incomplete" for o in r.output if o.type in ("function_call", "message"))


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    species: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=30)


def test_parse_with_text_format_returns_a_valid_instance(target):
    c, model, _ = target
    # Not stored: the tiny Qwen3 server is shared with suites that expect its KV free.
    r = c.responses.parse(model=model, input="Describe a pet as JSON.", text_format=Pet,
                          max_output_tokens=80, temperature=0.7, store=False)
    assert r.status == "completed", r.output
    assert isinstance(r.output_parsed, Pet), r.output_text
    j = c.responses.create(model=model, input="A JSON object about a cat.", max_output_tokens=60,
                           text={"format": {"type": "json_object"}}, temperature=0.7, store=False)
    if j.status == "completed":
        assert isinstance(json.loads(j.output_text), dict)


def test_stored_responses_are_retrieved_listed_and_deleted(client):
    c, model = client
    r = c.responses.create(model=model, input=[{"role": "user", "content": "Hi"}],
                           max_output_tokens=8, temperature=0, metadata={"k": "v"})
    assert r.store is True and r.metadata == {"k": "v"}
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    items = c.responses.input_items.list(r.id).data
    assert len(items) == 1 and items[0].type == "message" and items[0].id
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model=model, previous_response_id=r.id, input="again", max_output_tokens=4)
    assert e.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing(client):
    c, model = client
    r = c.responses.create(model=model, input="Hi", max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


@pytest.fixture(scope="module")
def short_lived(gguf):
    server = start_server("responses-ttl", gguf, "--response-ttl", "2", "--kv-memory", "64MiB")
    yield server
    server.stop()


def test_a_stored_chain_holds_kv_until_it_expires(short_lived):
    c = make_client(short_lived)
    model = c.models.list().data[0].id
    total = short_lived.health()["kv_pages_total"]
    r = c.responses.create(model=model, input="Count from one to twenty.", max_output_tokens=40, temperature=0)
    held = short_lived.wait_idle()["kv_pages_free"]
    assert held < total  # the chain's pin holds the conversation's blocks
    time.sleep(2.5)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    deadline = time.monotonic() + 10
    while short_lived.health()["kv_pages_free"] != total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert short_lived.health()["kv_pages_free"] == total
    c.close()


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "bogus": 1}, "bogus"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "computer_call"}]}, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tool_choice": "sometimes", "tools": WEATHER}, "tool_choice"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
])
def test_bad_input_is_refused_naming_the_field(smol, body, param):
    r = httpx.post(smol.v1 + "/responses", json={"model": "m", **body}, timeout=30)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"]


def test_sdk_fields_are_accepted(client):
    c, model = client
    r = c.responses.create(
        model=model, input="Hi", max_output_tokens=4, store=False, user="u1", service_tier="auto",
        prompt_cache_key="k", safety_identifier="s", truncation="disabled", parallel_tool_calls=True,
        include=["message.output_text.logprobs"], top_logprobs=2, text={"verbosity": "low"},
        reasoning={"effort": "low", "summary": "auto"}, stream_options=None,
    )
    assert r.status in ("completed", "incomplete")
    lps = r.output[0].content[0].logprobs
    assert len(lps) == r.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 for lp in lps)
