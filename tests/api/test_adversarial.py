"""The adversarial suite: hundreds of malformed requests over every route and the WebSocket,
each sent to a real `vigil serve` (the tiny Qwen3 checkpoint, a 64 KiB body limit so oversize
cases are cheap). For every case: no 5xx, any error in its route's JSON envelope (OpenAI's, or
Anthropic's under `/v1/messages`), and `/health` still answering right after it.

The cases are generated from classes (invalid JSON, wrong top-level types, wrong field types,
huge numbers, deep nesting, invalid UTF-8, NUL bytes, wrong content types, wrong methods, bad
path ids, oversize bodies, WebSocket frame abuse), so the count is a product, asserted at the
end to stay at or above 300."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed

from conftest import TINY, start_server

BODY_LIMIT = 65536
SESSION = "adv"

POST_ROUTES = [
    "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
    "/tokenize", "/detokenize", "/v1/sessions", f"/v1/sessions/{SESSION}/push",
    f"/v1/sessions/{SESSION}/generate", f"/v1/sessions/{SESSION}/warm", f"/v1/sessions/{SESSION}/flash",
]
GET_ROUTES = [
    "/health", "/healthz", "/metrics", "/v1/models", "/v1/models/x", "/v1/sessions",
    f"/v1/sessions/{SESSION}", f"/v1/sessions/{SESSION}/data", f"/v1/sessions/{SESSION}/flash",
]
DELETE_ROUTES = [f"/v1/sessions/{SESSION}/flash/999"]

RAW_BODIES = {
    "truncated": b'{"messages": [',
    "trailing-garbage": b'{"prompt": "a"} x',
    "two-values": b"{}{}",
    "single-quotes": b"{'prompt': 'a'}",
    "bom": b'\xef\xbb\xbf{"prompt": "a"}',
    "invalid-utf8": b'{"prompt": "\xff\xfe\xfd"}',
    "invalid-utf8-key": b'{"\xc3\x28": 1}',
    "nul": b'{"prompt": "a\x00b"}',
    "lone-surrogate": b'{"prompt": "\\ud800"}',
    "deep-array": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "nan": b'{"temperature": NaN, "prompt": "a"}',
    "empty": b"",
    "whitespace": b"   \n",
    "oversize": b'{"prompt": "' + b"a" * (BODY_LIMIT + 10) + b'"}',
}
JSON_BODIES = {
    "array": [],
    "string": "x",
    "number": 1,
    "null": None,
    "unknown-field": {"definitely_not_a_field": 1},
    "huge-int": {"max_tokens": 2**70, "prompt": "a", "messages": [{"role": "user", "content": "a"}]},
    "negative": {"max_tokens": -1, "prompt": "a", "messages": [{"role": "user", "content": "a"}]},
    "huge-float": {"temperature": 1e308, "prompt": "a"},
    "messages-string": {"messages": "hi"},
    "content-object": {"messages": [{"role": "user", "content": {"x": 1}}]},
    "bad-role": {"messages": [{"role": "wizard", "content": "a"}]},
    "tokens-huge": {"tokens": [2**40]},
    "data-number": {"data": 12},
    "data-nested": {"data": [[["a"]]]},
    "query-empty": {"query": ""},
    "window-huge": {"window": 2**62},
    "id-bad": {"id": "../../etc/passwd"},
    "stop-many": {"prompt": "a", "stop": ["a"] * 100},
    "long-key": {"k" * 10_000: 1},
}
CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                 "application/xml"]
BAD_IDS = ["%ff%fe", "a" * 300, "..", "%00", "a%20b", "%e2%80%ae"]
WS_FRAMES = {
    "invalid-json": "{",
    "not-an-object": "[1, 2]",
    "unknown-type": json.dumps({"type": "explode"}),
    "no-type": json.dumps({"data": "x"}),
    "push-no-data": json.dumps({"type": "push"}),
    "push-number": json.dumps({"type": "push", "data": 5}),
    "push-empty-list": json.dumps({"type": "push", "data": []}),
    "push-nested": json.dumps({"type": "push", "data": [[1]]}),
    "deep": "[" * 20_000 + "]" * 20_000,
    "huge-number": '{"type": "push", "data": 1e400}',
    "nul": json.dumps({"type": "push", "data": "a\u0000b"}),
}

CASES: list[tuple] = []
for path in POST_ROUTES:
    CASES += [("raw", path, name) for name in RAW_BODIES]
    CASES += [("json", path, name) for name in JSON_BODIES]
    CASES += [("ctype", path, ct) for ct in CONTENT_TYPES]
    CASES += [("method", path, m) for m in ("PUT", "PATCH")]
for path in GET_ROUTES:
    CASES += [("method", path, m) for m in ("POST", "PUT")] if not path.startswith("/v1/sessions") else \
             [("method", path, "PUT")]
for path in DELETE_ROUTES:
    CASES += [("method", path, "POST")]
for tail in ("", "/data", "/flash", "/push", "/generate", "/events", "/ws"):
    CASES += [("bad-id", tail, bad) for bad in BAD_IDS]
CASES += [("ws", "/ws", name) for name in WS_FRAMES]
CASES += [("ws-binary", "/ws", "binary"), ("ws-oversize", "/ws", "oversize"),
          ("ws-no-upgrade", "/ws", "plain-get")]


@pytest.fixture(scope="module")
def adv():
    server = start_server("adversarial", str(TINY / "qwen3"), "--kv-memory", "16MiB",
                          "--max-body-bytes", str(BODY_LIMIT))
    r = httpx.post(server.v1 + "/sessions", json={"id": SESSION}, timeout=30)
    assert r.status_code == 200, r.text
    yield server
    server.stop()


def check_envelope(r: httpx.Response, what: str) -> None:
    info = f"{what}: {r.status_code} {r.headers.get('content-type')} {r.text[:300]!r}"
    assert r.status_code < 500, info
    if r.status_code < 400:
        return
    assert r.headers.get("content-type", "").startswith("application/json"), info
    body = r.json()
    if r.request.url.path.startswith("/v1/messages"):
        assert body.get("type") == "error" and isinstance(body["error"]["message"], str), info
    else:
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], info


def alive(server) -> None:
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200, f"server not healthy after the case: {r.status_code} {r.text[:200]}"


def ws_case(server, name: str) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/sessions/{SESSION}/ws"
    with ws_client.connect(url, max_size=None, open_timeout=10) as ws:
        first = json.loads(ws.recv(timeout=10))
        assert first["type"] == "connected", first
        try:
            if name == "binary":
                ws.send(b"\x00\x01binary")
            elif name == "oversize":
                ws.send(json.dumps({"type": "push", "data": "a" * (BODY_LIMIT + 100)}))
            else:
                ws.send(WS_FRAMES[name])
            while True:
                msg = json.loads(ws.recv(timeout=10))
                if msg["type"] in ("error", "push_ack"):
                    break
        except ConnectionClosed as e:
            # Only an oversize message may close the socket (1009, message too big).
            assert name == "oversize", (name, e)
            assert e.rcvd is not None and e.rcvd.code == 1009, e
            return
        assert name != "oversize", "an oversize message was accepted"
        if msg["type"] == "error":
            assert isinstance(msg["data"]["message"], str) and 400 <= msg["data"]["code"] < 500, msg
        # The socket still works after a protocol error.
        ws.send(json.dumps({"type": "ping"}))
        while json.loads(ws.recv(timeout=10))["type"] != "pong":
            pass


@pytest.mark.parametrize("kind,path,name", CASES, ids=[f"{k}:{p}:{n}"[:80] for k, p, n in CASES])
def test_bad_input_never_5xx_always_enveloped_server_alive(adv, kind, path, name):
    url = adv.url + path
    what = f"{kind} {path} {name}"
    if kind == "raw":
        r = httpx.post(url, content=RAW_BODIES[name], headers={"content-type": "application/json"}, timeout=60)
        check_envelope(r, what)
        assert r.status_code >= 400 or name in ("bom",), what
    elif kind == "json":
        r = httpx.post(url, content=json.dumps(JSON_BODIES[name]).encode(),
                       headers={"content-type": "application/json"}, timeout=60)
        check_envelope(r, what)
    elif kind == "ctype":
        r = httpx.post(url, content=b'{"prompt": "a"}', headers={"content-type": name}, timeout=60)
        check_envelope(r, what)
        assert r.status_code == 415, what
    elif kind == "method":
        r = httpx.request(name, url, content=b"{}", headers={"content-type": "application/json"}, timeout=60)
        check_envelope(r, what)
        assert r.status_code in (404, 405), what
    elif kind == "bad-id":
        method = "POST" if path in ("/push", "/generate") else "GET"
        r = httpx.request(method, adv.url + "/v1/sessions/" + name + path, content=b'{"data": "x"}',
                          headers={"content-type": "application/json"}, timeout=60)
        check_envelope(r, what)
        assert r.status_code in (400, 404), what
    elif kind == "ws-no-upgrade":
        r = httpx.get(adv.url + f"/v1/sessions/{SESSION}/ws", timeout=10)
        check_envelope(r, what)
        assert r.status_code == 400, what
    else:
        ws_case(adv, "binary" if kind == "ws-binary" else "oversize" if kind == "ws-oversize" else name)
    alive(adv)


def test_the_suite_has_at_least_300_cases():
    assert len(CASES) >= 300, len(CASES)


def test_nothing_leaked_after_the_suite(adv):
    """Runs last: the engine is idle and every KV block not held by the suite's session is free."""
    h = adv.wait_idle()
    assert h["running"] == 0 and h["queued"] == 0, h
    r = httpx.delete(adv.v1 + f"/sessions/{SESSION}", timeout=10)
    assert r.status_code == 200, r.text
    for s in httpx.get(adv.v1 + "/sessions", timeout=10).json()["data"]:
        assert httpx.delete(adv.v1 + f"/sessions/{s['id']}", timeout=10).status_code in (200, 409)
    import time
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        h = adv.health()
        if h["kv_pages_free"] == h["kv_pages_total"]:
            break
        time.sleep(0.1)
    assert h["kv_pages_free"] == h["kv_pages_total"], h
