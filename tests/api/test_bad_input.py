"""Bad requests against the real server over raw HTTP: each gets the right status, the right
error envelope (OpenAI's on /v1/chat/completions and /v1/completions, Anthropic's on
/v1/messages), a message or `param` naming the offending field, and never a 5xx."""

from __future__ import annotations

import copy
import json
import re
import time

import httpx
import pytest

from conftest import API_KEY, RUST_WORDS

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = "/v1/messages"
COUNT = "/v1/messages/count_tokens"

BASE = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    COMP: {"prompt": "hi", "max_tokens": 2},
    MSG: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    COUNT: {"messages": [{"role": "user", "content": "hi"}]},
}

# Every status this module saw, to check at the end that none was a 5xx it did not provoke.
SEEN: list[tuple[str, int]] = []


def send(server, method: str, path: str, *, json_body=None, content=None, headers=None,
         timeout: float = 120) -> httpx.Response:
    hdrs = {"content-type": "application/json", **(headers or {})}
    if json_body is not None:
        content = json.dumps(json_body).encode()
    r = httpx.request(method, server.url + path, content=content, headers=hdrs, timeout=timeout)
    SEEN.append((f"{method} {path}", r.status_code))
    return r


def body_for(path: str, drop: tuple[str, ...] = (), **changes) -> dict:
    body = copy.deepcopy(BASE[path])
    for k in drop:
        body.pop(k, None)
    body.update(changes)
    return body


def anthropic_flavor(path: str) -> bool:
    return path.startswith("/v1/messages")


def check_error(r: httpx.Response, path: str, status: int, names=None, code=None) -> dict:
    """Asserts the status and the envelope; `names` are acceptable spellings of the field the
    error must name (in `param`, or in the message)."""
    info = f"{r.request.method} {r.request.url.path} -> {r.status_code} {r.text[:500]!r}"
    assert r.status_code == status, info
    assert r.headers.get("content-type", "").startswith("application/json"), info
    j = r.json()
    if isinstance(names, str):
        names = (names,)
    if anthropic_flavor(path):
        assert j.get("type") == "error", info
        err = j.get("error")
        assert isinstance(err, dict), info
        assert isinstance(err.get("type"), str) and err["type"], info
        assert isinstance(err.get("message"), str) and err["message"], info
        assert isinstance(j.get("request_id"), str), f"Anthropic envelope lacks request_id: {info}"
        if names:
            assert any(n in err["message"] for n in names), f"message does not name {names}: {info}"
    else:
        err = j.get("error")
        assert isinstance(err, dict), info
        assert isinstance(err.get("message"), str) and err["message"], info
        assert isinstance(err.get("type"), str) and err["type"], info
        if names:
            param = err.get("param") or ""
            assert any(n in param or n in err["message"] for n in names), f"error does not name {names}: {info}"
        if code is not None:
            assert err.get("code") == code, info
    return err


# ── Malformed bodies ───────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", [CHAT, COMP, MSG, COUNT])
@pytest.mark.parametrize(
    "raw",
    [b'{"messages": [', b"", b"not json", b"[]", b"null", b'{"messages": [{"role": "user", "content": "hi"}]'],
    ids=["truncated", "empty", "garbage", "array", "null", "unclosed"],
)
def test_malformed_json(smol, path, raw):
    check_error(send(smol, "POST", path, content=raw), path, 400)


# ── Field validation: (path, body, field names the error must mention) ─────────────────────

FIELD_CASES = [
    # wrong types
    ("temperature-str", CHAT, body_for(CHAT, temperature="hot"), "temperature"),
    ("temperature-str", COMP, body_for(COMP, temperature="hot"), "temperature"),
    ("temperature-str", MSG, body_for(MSG, temperature="hot"), "temperature"),
    ("messages-int", CHAT, body_for(CHAT, messages=3), "messages"),
    ("messages-int", MSG, body_for(MSG, messages=3), "messages"),
    ("messages-int", COUNT, body_for(COUNT, messages=3), "messages"),
    ("prompt-object", COMP, body_for(COMP, prompt={"a": 1}), "prompt"),
    ("stream-str", CHAT, body_for(CHAT, stream="yes"), "stream"),
    ("max_tokens-str", MSG, body_for(MSG, max_tokens="ten"), "max_tokens"),
    # missing required fields
    ("no-messages", CHAT, body_for(CHAT, drop=("messages",)), "messages"),
    ("no-prompt", COMP, body_for(COMP, drop=("prompt",)), "prompt"),
    ("no-max_tokens", MSG, body_for(MSG, drop=("max_tokens",)), "max_tokens"),
    ("empty-messages", CHAT, body_for(CHAT, messages=[]), "messages"),
    ("empty-messages", MSG, body_for(MSG, messages=[]), "messages"),
    # out of range
    ("top_p-0", CHAT, body_for(CHAT, top_p=0), "top_p"),
    ("top_p-0", COMP, body_for(COMP, top_p=0), "top_p"),
    ("top_p-0", MSG, body_for(MSG, top_p=0), "top_p"),
    ("top_p-1.5", CHAT, body_for(CHAT, top_p=1.5), "top_p"),
    ("temperature-5", CHAT, body_for(CHAT, temperature=5), "temperature"),
    ("temperature-5", COMP, body_for(COMP, temperature=5), "temperature"),
    ("temperature-5", MSG, body_for(MSG, temperature=5), "temperature"),
    ("temperature-neg", CHAT, body_for(CHAT, temperature=-0.5), "temperature"),
    ("top_logprobs-21", CHAT, body_for(CHAT, logprobs=True, top_logprobs=21), "top_logprobs"),
    ("logprobs-21", COMP, body_for(COMP, logprobs=21), "logprobs"),
    ("max_tokens-0", CHAT, body_for(CHAT, max_tokens=0), "max_tokens"),
    ("max_tokens-0", COMP, body_for(COMP, max_tokens=0), "max_tokens"),
    ("max_tokens-0", MSG, body_for(MSG, max_tokens=0), "max_tokens"),
    ("max_tokens-neg", CHAT, body_for(CHAT, max_tokens=-3), "max_tokens"),
    ("max_completion_tokens-0", CHAT, body_for(CHAT, drop=("max_tokens",), max_completion_tokens=0),
     "max_completion_tokens"),
    ("n-17", CHAT, body_for(CHAT, n=17), "n"),
    ("n-17", COMP, body_for(COMP, n=17), "n"),
    ("token-id-outside-vocab", COMP, body_for(COMP, prompt=[1, 10**9]), "prompt"),
    # unknown and refused fields
    ("unknown-field", CHAT, body_for(CHAT, frobnicate=1), "frobnicate"),
    ("unknown-field", COMP, body_for(COMP, frobnicate=1), "frobnicate"),
    ("unknown-field", MSG, body_for(MSG, frobnicate=1), "frobnicate"),
    ("unknown-field", COUNT, body_for(COUNT, frobnicate=1), "frobnicate"),
    ("session_id-in-body", CHAT, body_for(CHAT, session_id="s1"), "session_id"),
    ("top_k-0", MSG, body_for(MSG, top_k=0), "top_k"),
    # stop strings
    ("5-stops", CHAT, body_for(CHAT, stop=["a", "b", "c", "d", "e"]), "stop"),
    ("5-stops", COMP, body_for(COMP, stop=["a", "b", "c", "d", "e"]), "stop"),
    ("stop-65-bytes", CHAT, body_for(CHAT, stop=["x" * 65]), "stop"),
    # messages
    ("unknown-role", CHAT, body_for(CHAT, messages=[{"role": "wizard", "content": "hi"}]), ("role", "wizard")),
    ("unknown-role", MSG, body_for(MSG, messages=[{"role": "wizard", "content": "hi"}]), ("role", "wizard")),
    ("system-role-in-messages", MSG,
     body_for(MSG, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]),
     "system"),
    ("system-role-in-messages", COUNT,
     body_for(COUNT, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]),
     "system"),
    ("content-int", CHAT, body_for(CHAT, messages=[{"role": "user", "content": 7}]), ("content", "messages")),
    # logit_bias keys are token ids
    ("logit_bias-non-id", CHAT, body_for(CHAT, logit_bias={"hello": 5}), "logit_bias"),
    ("logit_bias-non-id", COMP, body_for(COMP, logit_bias={"hello": 5}), "logit_bias"),
    # chat extensions
    ("chat_template_kwargs-unknown-key", CHAT, body_for(CHAT, chat_template_kwargs={"frobnicate": True}),
     ("chat_template_kwargs", "frobnicate")),
    ("reasoning_effort-bogus", CHAT, body_for(CHAT, reasoning_effort="extreme"), "reasoning_effort"),
    ("tool_choice-unknown-function", CHAT,
     body_for(CHAT, tools=[{"type": "function", "function": {"name": "f"}}],
              tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
    ("tool-type-not-function", CHAT,
     body_for(CHAT, tools=[{"type": "retrieval", "function": {"name": "f"}}]), ("tools", "type")),
]


@pytest.mark.parametrize("path,body,names", [c[1:] for c in FIELD_CASES],
                         ids=[f"{c[1].rsplit('/', 1)[-1]}-{c[0]}" for c in FIELD_CASES])
def test_field_validation(smol, path, body, names):
    check_error(send(smol, "POST", path, json_body=body), path, 400, names)


@pytest.mark.parametrize("path", [CHAT, COMP, MSG])
def test_refused_with_stream_true_before_streaming(smol, path):
    """A refused streaming request is a plain JSON error, not an SSE stream."""
    body = body_for(path, temperature=5, stream=True)
    with httpx.stream("POST", smol.url + path, json=body, timeout=60) as r:
        r.read()
        SEEN.append((path, r.status_code))
        check_error(r, path, 400, "temperature")


def test_unknown_field_is_named_in_param(smol):
    err = check_error(send(smol, "POST", CHAT, json_body=body_for(CHAT, frobnicate=1)), CHAT, 400)
    assert err.get("param") == "frobnicate", err


def test_valid_requests_still_work(smol):
    """Control: the base bodies above are valid, so each refusal is due to its one change."""
    for path in (CHAT, COMP, MSG):
        r = send(smol, "POST", path, json_body=BASE[path])
        assert r.status_code == 200, r.text
    r = send(smol, "POST", COUNT, json_body=BASE[COUNT])
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text


# ── Sizes and context limits ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", [CHAT, MSG])
def test_body_over_limit_is_413(smol, path):
    # The `smol` fixture runs with --max-body-bytes 1048576.
    big = body_for(path, messages=[{"role": "user", "content": "a " * 1_100_000}])
    check_error(send(smol, "POST", path, json_body=big), path, 413)


def test_chunked_body_over_limit_is_413(smol):
    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"a " * 32768
        yield b'"}], "max_tokens": 1}'

    r = httpx.post(smol.url + CHAT, content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    SEEN.append((CHAT, r.status_code))
    check_error(r, CHAT, 413)


def overflow_text(server) -> str:
    n = server.model_info()["max_model_len"]
    return "hello " * (n + 8)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", [CHAT, COMP, MSG])
def test_context_overflow(smol, path, stream):
    text = overflow_text(smol)
    if path == COMP:
        body = body_for(COMP, prompt=text, stream=stream)
    else:
        body = body_for(path, messages=[{"role": "user", "content": text}], stream=stream)
    t0 = time.monotonic()
    with httpx.stream("POST", smol.url + path, json=body, timeout=120) as r:
        r.read()
        SEEN.append((path, r.status_code))
        err = check_error(r, path, 400, code=None if path == MSG else "context_length_exceeded")
    if path == MSG:
        m = re.search(r"prompt is too long: (\d+) tokens > (\d+) maximum", err["message"])
        assert m, err
        assert int(m.group(1)) > int(m.group(2))
    else:
        assert err.get("param"), f"context overflow should name a param: {err}"
    # Refused before any compute: a prompt this long would take many seconds to prefill.
    assert time.monotonic() - t0 < 20


def test_body_under_limit_with_huge_prompt_is_context_error_not_413(smol):
    body = body_for(CHAT, messages=[{"role": "user", "content": "a " * 300_000}])
    check_error(send(smol, "POST", CHAT, json_body=body), CHAT, 400, code="context_length_exceeded")


def test_context_boundary(qwen128):
    """max_model_len is 128 here: a 127-token prompt is admitted, a 128-token one refused,
    and a reply that reaches the limit ends with finish_reason length."""
    limit = qwen128.model_info()["max_model_len"]
    assert limit == 128
    ok = send(qwen128, "POST", COMP, json_body={"prompt": [100] * (limit - 1), "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] == limit - 1
    bad = send(qwen128, "POST", COMP, json_body={"prompt": [100] * limit, "max_tokens": 1})
    check_error(bad, COMP, 400, code="context_length_exceeded")
    capped = send(qwen128, "POST", COMP,
                  json_body={"prompt": [100] * 120, "max_tokens": 100, "ignore_eos": True, "temperature": 0})
    assert capped.status_code == 200, capped.text
    cj = capped.json()
    assert cj["choices"][0]["finish_reason"] == "length"
    assert cj["usage"]["completion_tokens"] == limit - 120


def test_messages_context_window_exceeded(qwen128):
    msgs = [{"role": "user", "content": "tell me about the sea and the sky " * 2}]
    n = send(qwen128, "POST", COUNT, json_body={"messages": msgs}).json()["input_tokens"]
    assert n < 120
    r = send(qwen128, "POST", MSG, json_body={"messages": msgs, "max_tokens": 200, "ignore_eos": True})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["stop_reason"] == "model_context_window_exceeded", j
    u = j["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == n
    assert n + u["output_tokens"] == 128


# ── Authentication ─────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"authorization": API_KEY},
     {"authorization": f"Basic {API_KEY}"}],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "no-bearer-prefix", "basic"],
)
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", CHAT),
                                         ("POST", COMP), ("POST", MSG), ("POST", COUNT)])
def test_auth_required(keyed, method, path, headers):
    r = send(keyed, method, path, json_body=BASE.get(path), headers=headers)
    err = check_error(r, path, 401)
    assert err["type"] == "authentication_error", err


@pytest.mark.parametrize("headers", [{"authorization": f"Bearer {API_KEY}"}, {"x-api-key": API_KEY}],
                         ids=["bearer", "x-api-key"])
def test_auth_accepts_the_key(keyed, headers):
    assert send(keyed, "GET", "/v1/models", headers=headers).status_code == 200
    assert send(keyed, "GET", "/metrics", headers=headers).status_code == 200
    r = send(keyed, "POST", CHAT, json_body=BASE[CHAT], headers=headers)
    assert r.status_code == 200, r.text
    r = send(keyed, "POST", MSG, json_body=BASE[MSG], headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/health", "/healthz"])
def test_health_is_open_under_auth(keyed, path):
    r = send(keyed, "GET", path)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ok"


# ── Overload, unknown routes, sessions ─────────────────────────────────────────────────────


def test_over_capacity_is_503_with_retry_after(overload):
    overload.wait_idle()
    body = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120) as holder:
        with holder.stream("POST", overload.url + CHAT, json=body) as held:
            assert held.status_code == 200
            lines = held.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # admitted and running
            for path in (CHAT, MSG, COMP):
                r = send(overload, "POST", path, json_body=BASE[path])
                err = check_error(r, path, 503)
                ra = r.headers.get("retry-after")
                assert ra is not None and ra.strip().isdigit(), f"Retry-After: {ra!r}"
                del err
            # Cheap routes are not subject to admission.
            assert send(overload, "GET", "/health").status_code == 200
            assert send(overload, "GET", "/v1/models").status_code == 200
    h = overload.wait_idle()
    assert h["running"] == 0 and h["queued"] == 0
    # Admitted again once the server has noticed the held stream's disconnect.
    deadline = time.monotonic() + 5
    r = send(overload, "POST", CHAT, json_body=BASE[CHAT])
    while r.status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
        r = send(overload, "POST", CHAT, json_body=BASE[CHAT])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path", [("GET", "/v1/nope"), ("POST", "/v1/chat"), ("GET", "/"),
                                         ("POST", "/v1/messages/nope"), ("GET", "/v1/models/nope")])
def test_unknown_route_is_404(smol, method, path):
    r = send(smol, method, path, json_body={} if method == "POST" else None)
    check_error(r, path, 404)


@pytest.mark.parametrize("path", [CHAT, MSG])
def test_session_header_is_404(smol, path):
    r = send(smol, "POST", path, json_body=BASE[path], headers={"x-layerscale-session-id": "sess_missing"})
    check_error(r, path, 404, "sess_missing")


# ── Type errors told in JSON's terms, not Rust's ─────────────────────────────────────────

TYPE_CASES = [
    ("stop", CHAT, body_for(CHAT, stop=-1), "expected a string or an array of strings"),
    ("tool_choice", CHAT, body_for(CHAT, tool_choice=5), 'expected "none", "auto", "required" or'),
    ("messages[0].content", CHAT, body_for(CHAT, messages=[{"role": "user", "content": 5}]),
     "expected a string or an array of content parts"),
    ("messages[0]", CHAT, body_for(CHAT, messages=[1]), "expected an object"),
    ("stream_options", CHAT, body_for(CHAT, stream=True, stream_options=[]),
     "invalid type: array, expected an object"),
    ("prompt", COMP, body_for(COMP, prompt={"a": 1}),
     "expected a string, an array of strings, an array of token ids or an array of token-id arrays"),
    ("max_tokens", COMP, body_for(COMP, max_tokens=-1), "expected an integer from 0 to"),
    ("seed", COMP, body_for(COMP, seed="x"), "expected an integer from"),
    ("temperature", COMP, body_for(COMP, temperature=[]), "invalid type: array, expected a number"),
    ("messages", MSG, body_for(MSG, messages=3), "invalid type: integer `3`, expected an array"),
]


@pytest.mark.parametrize("field,path,body,phrase", TYPE_CASES, ids=[f"{c[1]}:{c[0]}" for c in TYPE_CASES])
def test_type_errors_say_what_was_expected_in_json_terms(smol, field, path, body, phrase):
    """A wrong-typed field's 400 names the field and the JSON shape it takes, never a Rust type
    (`untagged enum StopField`, `struct ChatMessage`, `u32`) or serde's `sequence` / `map`."""
    err = check_error(send(smol, "POST", path, json_body=body), path, 400, field)
    assert phrase in err["message"], err
    assert not RUST_WORDS.search(err["message"]), err


def test_session_push_type_error_says_what_was_expected(smol):
    r = send(smol, "POST", "/v1/sessions", json_body={})
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    try:
        r = send(smol, "POST", f"/v1/sessions/{sid}/push", json_body={"data": 5})
        err = check_error(r, "/v1/sessions", 400, "data")
        assert "expected a string or a non-empty array of strings" in err["message"], err
        assert not RUST_WORDS.search(err["message"]), err
    finally:
        send(smol, "DELETE", f"/v1/sessions/{sid}")


def test_no_5xx_and_still_serving(smol):
    """Runs last in this module: nothing above got a 5xx except the provoked overload 503s,
    and the server still answers."""
    bad = [(what, s) for what, s in SEEN if s >= 500 and s != 503]
    assert not bad, bad
    r = send(smol, "POST", CHAT, json_body=BASE[CHAT])
    assert r.status_code == 200, r.text
    h = smol.wait_idle()
    assert h["kv_pages_free"] == h["kv_pages_total"]
