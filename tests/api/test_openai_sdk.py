"""The official `openai` Python SDK against `vigil serve`: SmolLM2 (a real model) and the tiny
random Qwen3 checkpoint (Qwen3 chat template with tools and thinking).

Everything here goes through the SDK's own parsing, so a response shape the SDK cannot read
fails here even where raw-JSON tests would pass."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from conftest import REPO, TINY

SMOL_REFS = json.loads((REPO / "tests" / "fixtures" / "smollm2" / "llamacpp_refs.json").read_text())
QWEN_REFS = json.loads((TINY / "qwen3" / "ref.json").read_text())

CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]


def make_client(server, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=["smollm2", "tiny-qwen3"])
def target(request):
    """(client, model id, server) for each model; most behaviour must hold on both."""
    server = request.getfixturevalue("smol" if request.param == "smollm2" else "qwen")
    client = make_client(server)
    model = client.models.list().data[0].id
    yield client, model, server
    client.close()


@pytest.fixture(scope="module")
def qclient(qwen):
    client = make_client(qwen)
    yield client, client.models.list().data[0].id
    client.close()


def full_text(message) -> str:
    """Content and reasoning together: the tiny Qwen3 may route its output to either."""
    return (getattr(message, "reasoning", None) or "") + "\x00" + (message.content or "")


# ── Chat and completions basics ────────────────────────────────────────────────────────────


def test_models_list_and_retrieve(target):
    client, model, server = target
    models = client.models.list()
    assert len(models.data) == 1
    m = client.models.retrieve(model)
    assert m.id == model
    assert m.object == "model"
    assert isinstance(m.created, int) and m.created > 0
    assert isinstance(m.owned_by, str)


def test_chat_greedy_is_deterministic(target):
    client, model, _ = target
    a = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12)
    b = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12)
    assert a.object == "chat.completion"
    assert a.model == model
    assert len(a.choices) == 1
    choice = a.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert full_text(a.choices[0].message) == full_text(b.choices[0].message)
    u = a.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert 1 <= u.completion_tokens <= 12
    assert u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0
    if choice.finish_reason == "length":
        assert u.completion_tokens == 12


def test_chat_prompt_tokens_match_reference_template(smol):
    """The SmolLM2 chat template renders system + user exactly as llama.cpp tokenized it."""
    case = next(c for c in SMOL_REFS["cases"] if c["name"] == "chat_instruct")
    client = make_client(smol)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
        ],
        temperature=0,
        max_tokens=4,
    )
    assert r.usage.prompt_tokens == len(case["prompt_ids"])


def test_completions_text_and_token_ids_agree(target):
    client, model, server = target
    if server.name == "smollm2":
        case = next(c for c in SMOL_REFS["cases"] if c["name"] == "prose")
        text, ids = case["prompt_text"], case["prompt_ids"]
    else:
        case = QWEN_REFS["prompts"][0]
        text, ids = case["text"], case["ids"]
    by_text = client.completions.create(model=model, prompt=text, temperature=0, max_tokens=10)
    again = client.completions.create(model=model, prompt=text, temperature=0, max_tokens=10)
    by_ids = client.completions.create(model=model, prompt=ids, temperature=0, max_tokens=10)
    assert by_text.object == "text_completion"
    assert by_text.choices[0].text == again.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids)
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_text.choices[0].finish_reason in ("stop", "length")


# ── Streaming ──────────────────────────────────────────────────────────────────────────────


def test_chat_stream_matches_non_streamed(target):
    client, model, _ = target
    whole = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=16)
    chunks = list(
        client.chat.completions.create(
            model=model, messages=CHAT, temperature=0, max_tokens=16,
            stream=True, stream_options={"include_usage": True},
        )
    )
    assert chunks, "no chunks"
    last = chunks[-1]
    assert last.choices == [], f"the usage chunk must be last with choices == [], got {last}"
    assert last.usage is not None
    for c in chunks[:-1]:
        assert c.object == "chat.completion.chunk"
        assert c.usage is None, f"usage before the final chunk: {c}"
        assert len(c.choices) == 1
    content = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks[:-1])
    msg = whole.choices[0].message
    assert content == (msg.content or "")
    assert reasoning == (getattr(msg, "reasoning", None) or "")
    finishes = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.total_tokens == whole.usage.total_tokens
    assert len({c.id for c in chunks}) == 1


def test_completions_stream_matches_non_streamed(target):
    client, model, _ = target
    prompt = "Once upon a time"
    whole = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12)
    chunks = list(
        client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=12,
            stream=True, stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text


def test_stream_without_include_usage_has_no_usage_chunk(target):
    client, model, _ = target
    chunks = list(
        client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=4, stream=True)
    )
    assert all(len(c.choices) == 1 for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


# ── Logprobs ───────────────────────────────────────────────────────────────────────────────


def check_top_logprobs(entries, k: int, greedy: bool) -> None:
    for e in entries:
        assert e.logprob <= 0.0
        assert isinstance(e.token, str)
        assert e.bytes is None or isinstance(e.bytes, list)
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == k
        assert tops == sorted(tops, reverse=True), f"top_logprobs not sorted: {tops}"
        assert all(t <= 0.0 for t in tops)
        if greedy:
            # Greedy picks the argmax, so the chosen token is the most probable one.
            assert e.logprob == pytest.approx(tops[0], abs=1e-4)


def test_chat_logprobs(target):
    client, model, _ = target
    r = client.chat.completions.create(
        model=model, messages=CHAT, temperature=0, max_tokens=8, logprobs=True, top_logprobs=5,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert len(lp.content) == r.usage.completion_tokens == 8
    check_top_logprobs(lp.content, 5, greedy=True)


def test_chat_logprobs_streamed_equal_non_streamed(target):
    client, model, _ = target
    kwargs = dict(model=model, messages=CHAT, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs)
    streamed, content_chunks, with_logprobs = [], 0, 0
    for c in client.chat.completions.create(**kwargs, stream=True):
        if c.choices and c.choices[0].delta.content:
            content_chunks += 1
            with_logprobs += bool(c.choices[0].logprobs and c.choices[0].logprobs.content)
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
            streamed.extend(c.choices[0].logprobs.content)
    # Each delta carries its own tokens' logprobs, not all of them at the end.
    assert content_chunks >= 3 and with_logprobs >= content_chunks - 1, (content_chunks, with_logprobs)
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in whole.choices[0].logprobs.content
    ]


def test_logprobs_absent_unless_asked(target):
    client, model, _ = target
    r = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=2)
    assert r.choices[0].logprobs is None


def test_completions_logprobs(target):
    client, model, _ = target
    r = client.completions.create(model=model, prompt="The sky is", temperature=0, max_tokens=6, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens == 6
    assert all(x <= 0.0 for x in lp.token_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    for token, chosen, tops in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # The legacy format keys alternatives by their text, so tokens that render alike (two
        # halves of a UTF-8 character both show as U+FFFD) share one entry.
        assert 1 <= len(tops) <= 3
        assert token in tops
        assert max(tops.values()) <= chosen + 1e-4, "greedy chose a token less likely than an alternative"


# ── Stop strings, seeds, length ────────────────────────────────────────────────────────────


def test_stop_string_truncates_before_it(smol):
    client = make_client(smol)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Tell me a short story about a dog and a cat."}]
    full = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24,
                                          extra_body={"ignore_eos": True})
    text = full.choices[0].message.content
    words = text.split()
    assert len(words) >= 4, f"greedy output too short to pick a stop word from: {text!r}"
    stop = words[3]
    expected = text[: text.index(stop)]
    for stops in (stop, [stop, "\u2603never\u2603"]):
        r = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24, stop=stops,
                                           extra_body={"ignore_eos": True})
        out = r.choices[0].message.content
        assert stop not in out
        assert r.choices[0].finish_reason == "stop"
        assert out == expected
    # Completions honour stop strings the same way.
    comp = client.completions.create(model=model, prompt="The old lighthouse keeper", temperature=0, max_tokens=16,
                                     extra_body={"ignore_eos": True})
    ctext = comp.choices[0].text
    cstop = ctext.split()[2]
    r = client.completions.create(model=model, prompt="The old lighthouse keeper", temperature=0, max_tokens=16,
                                  stop=[cstop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == ctext[: ctext.index(cstop)]
    assert r.choices[0].finish_reason == "stop"


def test_stop_string_in_stream(smol):
    client = make_client(smol)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Tell me a short story about a dog and a cat."}]
    full = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    stop = full.split()[3]
    chunks = list(client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24,
                                                 stop=stop, stream=True, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full[: full.index(stop)], "streamed text must never include (part of) the stop string"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproducibility(target):
    client, model, _ = target

    def sample(seed):
        r = client.chat.completions.create(model=model, messages=CHAT, temperature=0.8, max_tokens=10, seed=seed,
                                           extra_body={"ignore_eos": True})
        return full_text(r.choices[0].message)

    assert sample(7) == sample(7)
    texts = [sample(s) for s in (1, 2, 3, 4, 5)]
    assert len(set(texts)) > 1, f"five different seeds all gave {texts[0]!r}"


def test_max_tokens_gives_length(target):
    client, model, _ = target
    for key in ("max_tokens", "max_completion_tokens"):
        r = client.chat.completions.create(model=model, messages=CHAT, temperature=0, **{key: 5},
                                           extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 5
    c = client.completions.create(model=model, prompt="Hello", temperature=0, max_tokens=5,
                                  extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 5


def test_min_tokens_bans_end_of_sequence_until_reached(smol):
    client = make_client(smol)
    model = client.models.list().data[0].id
    free = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=200)
    assert free.choices[0].finish_reason == "stop", "the reference reply must end by itself"
    n = free.usage.completion_tokens
    held = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=200,
                                          extra_body={"min_tokens": n + 8})
    assert held.usage.completion_tokens >= n + 8
    # Until the EOS would have come, the held reply is the same text.
    assert held.choices[0].message.content.startswith(free.choices[0].message.content.rstrip())


# ── Tools (tiny Qwen3: the template calls tools with <tool_call>) ──────────────────────────

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
TOOL_MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call_shape(call, names) -> None:
    assert isinstance(call.id, str) and call.id
    assert call.type == "function"
    assert call.function.name in names
    assert isinstance(call.function.arguments, str)


def check_finished_or_cut(r, max_tokens: int) -> None:
    """A forced call is either finished (`tool_calls`, arguments one JSON object) or cut by
    `max_tokens` (`length`, every token spent); the random tiny model often never closes its
    strings, and a cut call must not read as finished."""
    choice = r.choices[0]
    assert choice.finish_reason in ("tool_calls", "length"), choice
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls:
            assert isinstance(json.loads(call.function.arguments), dict), call
    else:
        assert r.usage.completion_tokens == max_tokens, r.usage


def test_tool_choice_named_function(qclient):
    client, model = qclient
    r = client.chat.completions.create(
        model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    choice = r.choices[0]
    check_finished_or_cut(r, 48)
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1
    check_call_shape(calls[0], {"get_time"})
    assert calls[0].function.name == "get_time"
    # The opener is forced, so the model wrote the arguments: they are its text (valid JSON or
    # not), never dropped to "".
    assert calls[0].function.arguments, f"arguments dropped after {r.usage.completion_tokens} tokens"


def test_tool_choice_required(qclient):
    client, model = qclient
    r = client.chat.completions.create(
        model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0, max_tokens=48, tool_choice="required",
    )
    choice = r.choices[0]
    check_finished_or_cut(r, 48)
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call_shape(call, {"get_weather", "get_time"})


def test_tool_choice_auto_is_shape_valid(qclient):
    client, model = qclient
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0.8, seed=seed, max_tokens=24,
        )
        choice = r.choices[0]
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                check_call_shape(call, {"get_weather", "get_time"})
        else:
            assert choice.message.content is None or isinstance(choice.message.content, str)


def test_tool_choice_none_never_calls(qclient):
    client, model = qclient
    r = client.chat.completions.create(model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0, max_tokens=16,
                                       tool_choice="none")
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_forced_call_streams_as_opener_plus_arguments(qclient):
    client, model = qclient
    kwargs = dict(model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0, max_tokens=48,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    call_chunks = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(call_chunks) == 2, f"expected opener + arguments, got {[c.choices[0].delta for c in call_chunks]}"
    opener = call_chunks[0].choices[0].delta.tool_calls
    args = call_chunks[1].choices[0].delta.tool_calls
    assert len(opener) == 1 and len(args) == 1
    assert opener[0].index == 0 and args[0].index == 0
    assert opener[0].id and opener[0].type == "function"
    assert opener[0].function.name == "get_weather"
    assert opener[0].function.arguments == ""
    assert isinstance(args[0].function.arguments, str) and args[0].function.arguments
    assert args[0].function.arguments == whole.choices[0].message.tool_calls[0].function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check_finished_or_cut(whole, 48)
    assert finishes == [whole.choices[0].finish_reason]


def test_a_forced_call_cut_by_max_tokens_ends_with_length(qclient, qwen):
    """A call cut before its arguments close is `length` (`max_tokens` on /v1/messages), never
    a finished call."""
    client, model = qclient
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        kwargs = dict(model=model, messages=TOOL_MSGS, tools=TOOLS, temperature=0, max_tokens=3, tool_choice=forced)
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True))
            finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finishes == ["length"]
        else:
            r = client.chat.completions.create(**kwargs)
            assert r.choices[0].finish_reason == "length"
            assert r.usage.completion_tokens == 3
    # Greedy, and a required argument: a sampled `{}` could close the call within 3 tokens.
    body = {
        "model": model, "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    r = httpx.post(qwen.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "max_tokens"


# ── Errors surface as the SDK's typed exceptions ───────────────────────────────────────────


def test_unknown_parameter_is_bad_request(target):
    client, model, _ = target
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, extra_body={"frobnicate": 1})
    assert e.value.status_code == 400
    assert e.value.param == "frobnicate" or "frobnicate" in e.value.message


def test_n_out_of_range_is_bad_request(target):
    client, model, _ = target
    for n in (0, 17):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, n=n)
        assert e.value.param == "n"
    # n = 1 is fine.
    client.chat.completions.create(model=model, messages=CHAT, max_tokens=1, n=1)


def test_bad_temperature_type_is_bad_request(target):
    client, model, _ = target
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature="hot")  # type: ignore[arg-type]
    assert e.value.param == "temperature" or "temperature" in e.value.message


def test_unknown_model_is_not_found(target):
    client, model, _ = target
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert client.models.retrieve(model.upper()).id == model


def test_wrong_api_key_is_authentication_error(keyed):
    from conftest import API_KEY

    with pytest.raises(openai.AuthenticationError):
        make_client(keyed, api_key="wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        make_client(keyed, api_key="wrong").chat.completions.create(model="m", messages=CHAT, max_tokens=1)
    good = make_client(keyed, api_key=API_KEY)
    model = good.models.list().data[0].id
    r = good.chat.completions.create(model=model, messages=CHAT, max_tokens=1)
    assert r.usage.completion_tokens == 1


def test_overload_is_503(overload):
    client = make_client(overload)
    model = client.models.list().data[0].id
    overload.wait_idle()
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=400, stream=True,
                                            extra_body={"ignore_eos": True})
    try:
        it = iter(stream)
        first = next(it)  # the long request is admitted and running
        assert first.choices
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=2)
        assert e.value.status_code == 503
        assert e.value.response.headers.get("retry-after"), "503 without Retry-After"
    finally:
        stream.close()
    # Once the held stream is gone the server admits requests again (within a few seconds: it
    # notices the disconnect at its next write).
    h = overload.wait_idle()
    assert h["running"] == 0
    deadline = time.monotonic() + 5
    while True:
        try:
            r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=1)
            break
        except openai.APIStatusError as e:
            if e.status_code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert r.usage.completion_tokens == 1


def test_concurrent_sdk_calls_are_independent(target):
    """A few SDK calls at once return what each returns alone."""
    client, model, _ = target
    prompts = [f"Count to {n}." for n in (3, 4, 5)]
    alone = [
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], temperature=0,
                                       max_tokens=8).choices[0].message
        for p in prompts
    ]
    together: list = [None] * len(prompts)

    def run(i: int) -> None:
        together[i] = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompts[i]}], temperature=0, max_tokens=8
        ).choices[0].message

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [full_text(m) for m in together] == [full_text(m) for m in alone]


def test_logit_bias_forces_a_token(target):
    """A +100 bias on one token id makes greedy decoding repeat that token; two different ids
    give two different texts."""
    client, model, server = target
    ids = SMOL_REFS["cases"][1]["prompt_ids"] if server.name == "smollm2" else QWEN_REFS["prompts"][0]["ids"]
    a, b = ids[1], next(i for i in ids[2:] if i != ids[1])
    outs = []
    for tok in (a, b):
        r = client.completions.create(model=model, prompt="Hello", temperature=0, max_tokens=3, logprobs=1,
                                      logit_bias={str(tok): 100}, extra_body={"ignore_eos": True})
        toks = r.choices[0].logprobs.tokens
        assert len(toks) == 3 and len(set(toks)) == 1, f"bias on {tok} gave {toks}"
        outs.append(toks[0])
    assert outs[0] != outs[1]
