"""A request id on every response: the client's `x-request-id` echoed (what the OpenAI SDKs read
into `_request_id`), a generated `req_…` otherwise, `request-id` for Anthropic's SDKs, on errors
too, and in the server's log line of a refused request."""

from __future__ import annotations

import time

import httpx

from test_openai_sdk import make_client


def test_the_sdk_sees_a_generated_id_and_an_echoed_one(smol):
    client = make_client(smol)
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
    assert r._request_id and r._request_id.startswith("req_")
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=msgs, max_tokens=2, extra_headers={"x-request-id": "trace-42/a"}
    )
    assert raw.headers["x-request-id"] == "trace-42/a"
    assert raw.headers["request-id"] == "trace-42/a"
    assert raw.parse()._request_id == "trace-42/a"
    a, b = (client.completions.create(model="m", prompt="x", max_tokens=1)._request_id for _ in range(2))
    assert a != b


def test_every_route_and_every_error_carries_one(smol):
    cases = [
        ("GET", "/health", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/v1/nowhere", None, 404),
        ("POST", "/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}, 200),
        ("POST", "/v1/chat/completions", {"messages": [], "max_tokens": 2}, 400),
        ("POST", "/v1/sessions", {"bogus": 1}, 400),
    ]
    for method, path, body, status in cases:
        r = httpx.request(method, smol.url + path, json=body, timeout=60)
        assert r.status_code == status, (path, r.text)
        assert r.headers.get("x-request-id", "").startswith("req_"), path
        assert r.headers["request-id"] == r.headers["x-request-id"]


def test_an_unusable_client_id_is_replaced(smol):
    for bad in ["x" * 201, "has space", ""]:
        r = httpx.get(smol.url + "/health", headers={"x-request-id": bad}, timeout=30)
        assert r.headers["x-request-id"].startswith("req_"), bad


def test_a_refused_request_is_logged_under_its_id(smol):
    rid = f"log-check-{time.time_ns()}"
    r = httpx.post(
        f"{smol.v1}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1},
        headers={"x-request-id": rid},
        timeout=60,
    )
    assert r.status_code == 400
    deadline = time.time() + 10
    while time.time() < deadline:
        lines = [l for l in smol.log_path.read_text(errors="replace").splitlines() if rid in l]
        if lines:
            assert "request refused" in lines[0] and "frobnicate" in lines[0], lines[0]
            return
        time.sleep(0.1)
    raise AssertionError(f"no log line names {rid}")
