"""Speculative decoding through the real server on SmolLM2: with drafts from the suffix matcher
or prompt lookup, greedy answers are the answers without speculation, token for token and
log-probability for log-probability, for code, repetition, free text, tool calls (forced ones
run under their grammar), concurrent requests and a session generate. A prediction
(`prediction`, OpenAI's predicted outputs) is drafted from and reported in `usage`; the counters
reach `/metrics` under Vigil's and vLLM's names; bad fields are 400s naming them."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from conftest import TINY, prom_value, start_server
from test_openai_sdk import make_client

# Markup to repeat with one change: the shape of an edit an agent asks for (SmolLM2-135M follows
# it; it rewrites Python functions instead of copying them).
CODE = """Repeat this HTML exactly, changing the title to 'Home':
<html>
  <head>
    <title>Index</title>
  </head>
  <body>
    <h1>Welcome</h1>
    <p>Hello world</p>
  </body>
</html>"""

PYTHON = """Repeat this Python function exactly, but rename `total` to `acc`:
```python
def add_all(xs):
    total = 0
    for x in xs:
        if x is None:
            continue
        total += x
    return total
```"""

PROMPTS = {
    "code": CODE,
    "python": PYTHON,
    "repetition": "Write the words 'red apple' ten times, separated by commas.",
    "free": "Tell me a short story about a lighthouse keeper and a storm.",
    "list": "List the days of the week, one per line, then list them again in reverse order.",
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}]


def chat(server, content: str, speculative: str | None, max_tokens: int = 96, **extra) -> dict:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        **extra,
    }
    if speculative is not None:
        body["speculative"] = speculative
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def answer(body: dict):
    """What must not change: the message and every token's log-probabilities."""
    c = body["choices"][0]
    message = dict(c["message"])
    # Call ids are fresh per response.
    message["tool_calls"] = [call["function"] for call in message.get("tool_calls") or []]
    return message, c["finish_reason"], c["logprobs"]


def accepted(body: dict) -> int:
    """The predicted-output count `usage` reports (only for a request with a `prediction`)."""
    return (body["usage"].get("completion_tokens_details") or {}).get("accepted_prediction_tokens", 0)


def accepted_total(server) -> float:
    return prom_value(server.metrics_text(), "vigil_spec_accepted_tokens_total")


def chat_counting(server, *args, **kwargs) -> tuple[dict, float]:
    """A chat request and the draft tokens the server accepted meanwhile (tests run one at a
    time, so the counter moves for this request only)."""
    before = accepted_total(server)
    body = chat(server, *args, **kwargs)
    return body, accepted_total(server) - before


@pytest.fixture(scope="module")
def plain(smol):
    """Each prompt's greedy answer without speculation."""
    return {k: chat(smol, p, "off") for k, p in PROMPTS.items()}


@pytest.mark.parametrize("method", ["suffix", "ngram"])
def test_greedy_answers_are_identical_with_speculation(smol, plain, method):
    drafted = 0
    for k, p in PROMPTS.items():
        spec, n = chat_counting(smol, p, method)
        assert answer(spec) == answer(plain[k]), f"{method}: {k} differs"
        assert spec["usage"]["completion_tokens"] == plain[k]["usage"]["completion_tokens"]
        # Without a prediction, usage looks as it does without speculation.
        assert "completion_tokens_details" not in spec["usage"]
        drafted += n
        if k == "code":
            assert n > 20, "the code copy was not drafted"
    assert drafted > 40


def test_the_layerscale_client_reads_usage_with_speculation_on(smol):
    """`smol` drafts by default; LayerScale's client validates `usage` strictly (a
    `completion_tokens_details` must carry `reasoning_tokens`)."""
    import layerscale
    client = layerscale.LayerScale(base_url=smol.url, api_key="", max_retries=0, timeout=120)
    before = accepted_total(smol)
    r = client.chat.create(messages=[{"role": "user", "content": CODE}], max_tokens=48, temperature=0)
    assert r.choices[0].message.content
    assert accepted_total(smol) > before


def test_concurrent_requests_batch_with_speculation_unchanged(smol, plain):
    keys = list(PROMPTS) * 2
    with cf.ThreadPoolExecutor(len(keys)) as pool:
        futures = [pool.submit(chat, smol, PROMPTS[k], "suffix" if i % 2 == 0 else "off") for i, k in enumerate(keys)]
        for k, f in zip(keys, futures):
            assert answer(f.result()) == answer(plain[k]), k


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_tool_calls_are_identical_with_speculation(smol, tool_choice):
    ask = "What is the weather in Paris in celsius? Then in Lyon."
    off = chat(smol, ask, "off", tools=TOOLS, tool_choice=tool_choice)
    on = chat(smol, ask, "suffix", tools=TOOLS, tool_choice=tool_choice)
    assert answer(on) == answer(off)
    if tool_choice == "required":
        calls = on["choices"][0]["message"]["tool_calls"]
        assert calls and calls[0]["function"]["name"] == "get_weather"


def test_a_prediction_is_drafted_and_counted_in_usage(smol, plain):
    expected = plain["code"]["choices"][0]["message"]["content"]
    # A prediction with one change in the middle still drafts most of the answer, and the
    # answer does not change.
    half = len(expected) // 2
    prediction = expected[:half] + " changed " + expected[half + 8:]
    client = make_client(smol)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPTS["code"]}], max_tokens=96, temperature=0,
        prediction={"type": "content", "content": prediction}, extra_body={"speculative": "ngram"},
    )
    assert r.choices[0].message.content == expected
    details = r.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens > r.usage.completion_tokens // 2, r.usage
    assert details.rejected_prediction_tokens >= 1
    # Text parts are accepted too; `speculative: off` keeps the prediction unused.
    parts = {"type": "content", "content": [{"type": "text", "text": expected}]}
    on = chat(smol, PROMPTS["code"], None, prediction=parts)
    assert on["choices"][0]["message"]["content"] == expected and accepted(on) > 0
    off = chat(smol, PROMPTS["code"], "off", prediction=parts)
    assert off["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0, "reasoning_tokens": 0}


@pytest.mark.parametrize("body,field", [
    ({"speculative": "eagle"}, "speculative"),
    ({"speculative": 3}, "speculative"),
    ({"prediction": {"type": "text", "content": "x"}}, "prediction"),
    ({"prediction": {"type": "content", "content": [{"type": "image", "url": "x"}]}}, "prediction"),
    ({"prediction": "plain string"}, "prediction"),
])
def test_bad_speculation_fields_are_400s_naming_them(smol, body, field):
    r = httpx.post(smol.v1 + "/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"] or r.json()["error"].get("param") == field, r.text


def test_completions_take_the_field_too(smol):
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    before = accepted_total(smol)
    bodies = [httpx.post(smol.v1 + "/completions", json={
        "prompt": prompt, "max_tokens": 40, "temperature": 0, "logprobs": 2, "speculative": s}, timeout=120).json()
        for s in ("off", "suffix")]
    assert bodies[0]["choices"] == bodies[1]["choices"]
    assert accepted_total(smol) > before


@pytest.fixture(scope="module")
def plain_server(gguf):
    server = start_server("smollm2-nospec", gguf, "--kv-memory", "256MiB", "--speculative", "off")
    yield server
    server.stop()


def test_server_wide_speculation_and_its_metrics(smol, plain_server, plain, janitor):
    """`smol` runs with the default, `--speculative suffix`."""
    before = prom_value(smol.metrics_text(), "vigil_spec_accepted_tokens_total")
    for k in ("code", "list"):
        assert answer(chat(smol, PROMPTS[k], None)) == answer(plain[k]), k
        assert answer(chat(plain_server, PROMPTS[k], None)) == answer(plain[k]), k
    assert prom_value(plain_server.metrics_text(), "vigil_spec_proposed_tokens_total") == 0
    # A session generate (the session's whole history is the context the drafts come from)
    # answers exactly as on the server without speculation.
    entries = [f"reading {i}: sensor A at {20 + i % 3} C, sensor B at {30 - i % 4} C" for i in range(12)]
    answers = []
    for server in (plain_server, smol):
        sid = janitor.create(server)["id"]
        r = httpx.post(f"{server.v1}/sessions/{sid}/push", json={"data": entries, "wait": True}, timeout=120)
        assert r.status_code == 200, r.text
        g = httpx.post(f"{server.v1}/sessions/{sid}/generate", json={
            "prompt": "Repeat the last three readings exactly.", "max_tokens": 64, "temperature": 0}, timeout=300)
        assert g.status_code == 200, g.text
        answers.append(g.json()["text"])
    assert answers[0] == answers[1]
    m = smol.metrics_text()
    assert prom_value(m, "vigil_spec_accepted_tokens_total") > before
    proposed = prom_value(m, "vigil_spec_proposed_tokens_total")
    accepted_ = prom_value(m, "vigil_spec_accepted_tokens_total")
    assert 0 < accepted_ <= proposed
    assert prom_value(m, "vigil_spec_rejected_tokens_total") == proposed - accepted_
    assert prom_value(m, "vigil_spec_verifications_total") > 0
    assert 0 < prom_value(m, "vigil_spec_acceptance_rate") <= 1
    assert prom_value(m, "vigil_spec_mean_accepted_length") > 1
    assert prom_value(m, "vllm:spec_decode_num_accepted_tokens_total") == accepted_
    assert prom_value(m, "vllm:spec_decode_num_draft_tokens_total") == proposed


@pytest.fixture(scope="module")
def tiny_pair():
    """The tiny Llama with its BF16-rounded copy as draft model, and the same target without
    speculation."""
    target = str(TINY / "llama")
    with_draft = start_server("tiny-draft", target, "--kv-memory", "16MiB", "--no-persist",
                              "--speculative", f"draft:{TINY / 'llama_bf16'}")
    plain_ = start_server("tiny-nodraft", target, "--kv-memory", "16MiB", "--no-persist", "--speculative", "off")
    yield with_draft, plain_
    with_draft.stop()
    plain_.stop()


def test_a_draft_model_drafts_and_changes_nothing(tiny_pair):
    with_draft, plain_ = tiny_pair
    for prompt in ("hello world", "the cat sat on the mat and the cat", "1 2 3 4 5 6"):
        before = accepted_total(with_draft)
        bodies = [httpx.post(s.v1 + "/completions", json={
            "prompt": prompt, "max_tokens": 40, "temperature": 0, "logprobs": 2, "ignore_eos": True}, timeout=120).json()
            for s in (plain_, with_draft)]
        assert bodies[0]["choices"] == bodies[1]["choices"], prompt
        assert accepted_total(with_draft) > before, prompt
    # Seeded sampling too, and the request's own method still works beside the draft model.
    for method in (None, "suffix"):
        extra = {} if method is None else {"speculative": method}
        bodies = [httpx.post(s.v1 + "/completions", json={
            "prompt": "once upon a time", "max_tokens": 30, "temperature": 0.8, "seed": 7, "ignore_eos": True, **extra},
            timeout=120).json() for s in (plain_, with_draft)]
        assert bodies[0]["choices"][0]["text"] == bodies[1]["choices"][0]["text"], method
    m = with_draft.metrics_text()
    assert prom_value(m, "vigil_spec_accepted_tokens_total") > 0
    assert "draft model: " in with_draft.log_tail()


def test_draft_needs_a_server_with_a_draft_model(smol):
    r = httpx.post(smol.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2, "speculative": "draft"}, timeout=30)
    assert r.status_code == 400 and "--speculative draft:PATH" in r.json()["error"]["message"], r.text


def test_a_draft_model_of_another_vocabulary_is_refused_at_start(gguf):
    server = start_server("smollm2-draft", gguf, "--no-persist", "--speculative", f"draft:{TINY / 'llama'}", wait=False)
    try:
        code = server.wait_exit(120)
    finally:
        server.stop()
    assert code != 0
    assert "a draft model needs the target's vocabulary" in server.log_tail()
