"""Serving behaviour of `vigil serve` on SmolLM2: continuous batching gives each request what it
gets alone, the prefix cache is reported and counted, a client that goes away frees its
sequence and KV blocks, SIGTERM drains in-flight streams, and /health and /metrics carry the
documented fields."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid

import httpx
import pytest

from conftest import KV_BLOCK_TOKENS, iter_sse, proc_status_mib, prom_samples, prom_value, start_server

CHAT = "/v1/chat/completions"

TOPICS = [
    "the sea", "a mountain", "a red bicycle", "winter", "a small cat", "coffee", "a library", "the moon",
    "a train station", "bread", "a thunderstorm", "an old clock", "a garden", "a violin", "the desert",
    "a lighthouse", "snow", "a market", "a river", "a kite", "a forest", "the city at night", "a bee",
    "a ship", "tea", "a letter", "a bridge", "autumn leaves", "a piano", "a fox", "the stars", "a candle",
]
assert len(TOPICS) == 32


def stream_chat(url: str, body: dict, client: httpx.Client) -> dict:
    """Runs one streaming chat request; returns the text, finish reasons, usage and whether
    the stream ended with [DONE]."""
    text, finishes, usage, done, chunks = [], [], None, False, 0
    with client.stream("POST", url + CHAT, json={**body, "stream": True,
                                                  "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200, r.read()
        for _event, data in iter_sse(r):
            if data == "[DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            obj = json.loads(data)
            assert "error" not in obj, obj
            chunks += 1
            if obj.get("usage"):
                usage = obj["usage"]
            for c in obj["choices"]:
                text.append(c["delta"].get("content") or "")
                if c.get("finish_reason"):
                    finishes.append(c["finish_reason"])
    return {"text": "".join(text), "finishes": finishes, "usage": usage, "done": done, "chunks": chunks}


def story_body(topic: str, max_tokens: int = 24) -> dict:
    return {"messages": [{"role": "user", "content": f"Write a few words about {topic}."}],
            "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}


# ── (a) Concurrency ────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(420)
def test_32_concurrent_streams_match_sequential(smol):
    with httpx.Client(timeout=300) as client:
        alone = [stream_chat(smol.url, story_body(t), client) for t in TOPICS]
    for r in alone:
        assert r["done"] and r["finishes"] == ["length"] and r["usage"]["completion_tokens"] == 24, r

    async def one(client: httpx.AsyncClient, topic: str) -> dict:
        text, finishes, usage, done = [], [], None, False
        body = {**story_body(topic), "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", smol.url + CHAT, json=body) as r:
            assert r.status_code == 200, await r.aread()
            buf = b""
            async for chunk in r.aiter_bytes():
                buf += chunk
                while b"\n\n" in buf:
                    frame, buf = buf.split(b"\n\n", 1)
                    for line in frame.decode().split("\n"):
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            continue
                        obj = json.loads(data)
                        assert "error" not in obj, obj
                        if obj.get("usage"):
                            usage = obj["usage"]
                        for c in obj["choices"]:
                            text.append(c["delta"].get("content") or "")
                            if c.get("finish_reason"):
                                finishes.append(c["finish_reason"])
        return {"text": "".join(text), "finishes": finishes, "usage": usage, "done": done}

    async def all_at_once() -> list[dict]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            return await asyncio.gather(*(one(client, t) for t in TOPICS))

    together = asyncio.run(all_at_once())
    for topic, a, b in zip(TOPICS, alone, together):
        assert b["done"], f"{topic}: stream did not end with [DONE]"
        assert b["finishes"] == ["length"], f"{topic}: {b}"
        assert b["usage"] and b["usage"]["completion_tokens"] == 24, f"{topic}: {b}"
    mismatched = [(t, a["text"], b["text"]) for t, a, b in zip(TOPICS, alone, together) if a["text"] != b["text"]]
    assert not mismatched, f"{len(mismatched)}/32 differ under batching, e.g. {mismatched[:3]}"


# ── (b) Prefix cache ───────────────────────────────────────────────────────────────────────


def fresh_long_chat() -> dict:
    """A ~300-token chat body no earlier request shares a KV block with: the nonce opens the
    prompt (in the system message), so not even the first block can be cached."""
    nonce = uuid.uuid4().hex
    long_text = ("The harbour wakes before dawn; fishermen mend their nets, gulls circle the masts and "
                 "the smell of salt and diesel drifts over the quay. " * 10)
    return {"messages": [{"role": "system", "content": f"{nonce} You summarise."},
                         {"role": "user", "content": long_text + "Summarise."}],
            "temperature": 0, "max_tokens": 4}


def test_prefix_cache_hit_is_reported(smol):
    body = fresh_long_chat()
    m0 = prom_value(smol.metrics_text(), "vigil_prefix_cached_tokens_total")
    h0 = smol.health()
    first = httpx.post(smol.url + CHAT, json=body, timeout=120).json()
    second = httpx.post(smol.url + CHAT, json=body, timeout=120).json()
    n = first["usage"]["prompt_tokens"]
    assert 250 <= n <= 400, f"prompt is {n} tokens; the test wants ~300"
    assert second["usage"]["prompt_tokens"] == n
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    expected = ((n - 1) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == expected, f"prompt {n} tokens: cached {cached}, expected {expected}"
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    m1 = prom_value(smol.metrics_text(), "vigil_prefix_cached_tokens_total")
    assert m1 - m0 >= expected, f"vigil_prefix_cached_tokens_total grew by {m1 - m0}, expected {expected}"
    h1 = smol.health()
    assert h1["prefix_cached_tokens"] - h0["prefix_cached_tokens"] >= expected


def test_prefix_cached_tokens_detail(smol):
    """The prefix cache's share is itemised: `prefix_cached_tokens` on chat completions (only
    when non-zero), `cache_read_input_tokens` on /v1/messages."""
    body = fresh_long_chat()
    first = httpx.post(smol.url + CHAT, json=body, timeout=120).json()
    assert "prefix_cached_tokens" not in first["usage"]["prompt_tokens_details"]
    second = httpx.post(smol.url + CHAT, json=body, timeout=120).json()
    n = second["usage"]["prompt_tokens"]
    expected = ((n - 1) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    assert second["usage"]["prompt_tokens_details"].get("prefix_cached_tokens") == expected, second["usage"]
    msg = {"system": body["messages"][0]["content"], "messages": body["messages"][1:], "max_tokens": 4,
           "temperature": 0}
    m = httpx.post(smol.url + "/v1/messages", json=msg, timeout=120).json()
    u = m["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == n, u
    assert u["cache_read_input_tokens"] == expected, u
    assert u.get("prefix_cached_tokens") == expected, u


def test_prefix_cache_off(gguf):
    """--no-prefix-cache: the same prompt twice computes everything twice."""
    server = start_server("no-prefix-cache", gguf, "--kv-memory", "64MiB", "--no-prefix-cache")
    try:
        body = {"messages": [{"role": "user", "content": "The harbour wakes before dawn. " * 12}],
                "temperature": 0, "max_tokens": 2}
        a = httpx.post(server.url + CHAT, json=body, timeout=120).json()
        b = httpx.post(server.url + CHAT, json=body, timeout=120).json()
        assert a["usage"]["prompt_tokens"] > KV_BLOCK_TOKENS * 2
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    finally:
        server.stop()


# ── (c) Disconnects ────────────────────────────────────────────────────────────────────────


LONG = 4000  # tokens: ~15 s of decode at 270 tok/s, so a request this long outlives its client


def test_client_disconnect_frees_everything(smol):
    h0 = smol.wait_idle()
    assert h0["running"] == 0
    # Far more tokens than a fast CPU decodes while the client waits: the request must still be
    # running when the client leaves.
    body = {**story_body("a very long journey", max_tokens=LONG), "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", smol.url + CHAT, json=body) as r:
            assert r.status_code == 200
            # Keep the event iterator referenced: dropping it would close the connection early.
            events = iter_sse(r)
            for _ in range(3):
                _event, data = next(events)
                assert data != "[DONE]"
            during = smol.health()
            assert during["running"] == 1
            assert during["kv_pages_free"] < during["kv_pages_total"]
    # The response (and its connection) is closed here.
    deadline = time.monotonic() + 3.0
    h = smol.health()
    while time.monotonic() < deadline:
        h = smol.health()
        if h["running"] == 0 and h["kv_pages_free"] == h["kv_pages_total"] and \
                h["requests_cancelled"] > h0["requests_cancelled"]:
            break
        time.sleep(0.05)
    assert h["running"] == 0, h
    assert h["queued"] == 0, h
    assert h["kv_pages_free"] == h["kv_pages_total"], f"leaked KV blocks: {h}"
    assert h["requests_cancelled"] == h0["requests_cancelled"] + 1, h
    assert h["generated_tokens"] - h0["generated_tokens"] < LONG, "generation ran on after the client left"


def test_disconnect_during_non_streamed_request(smol):
    """A non-streamed request whose client times out is cancelled too."""
    h0 = smol.wait_idle()
    body = story_body("a very long journey", max_tokens=LONG)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(smol.url + CHAT, json=body, timeout=httpx.Timeout(60, read=1.5))
    deadline = time.monotonic() + 3.0
    h = smol.health()
    while time.monotonic() < deadline:
        h = smol.health()
        if h["running"] == 0 and h["kv_pages_free"] == h["kv_pages_total"]:
            break
        time.sleep(0.05)
    assert h["running"] == 0 and h["kv_pages_free"] == h["kv_pages_total"], h
    assert h["requests_cancelled"] == h0["requests_cancelled"] + 1, h


# ── (d) Graceful shutdown ──────────────────────────────────────────────────────────────────


def test_sigterm_drains_in_flight_streams(gguf):
    server = start_server("shutdown", gguf, "--kv-memory", "64MiB")
    result: dict = {}
    first_chunk = threading.Event()

    def consume() -> None:
        text, finishes, usage, done = [], [], None, False
        try:
            body = {**story_body("a long walk", max_tokens=80), "stream": True,
                    "stream_options": {"include_usage": True}}
            with httpx.Client(timeout=120) as client:
                with client.stream("POST", server.url + CHAT, json=body) as r:
                    result["status"] = r.status_code
                    for _event, data in iter_sse(r):
                        first_chunk.set()
                        if data == "[DONE]":
                            done = True
                            continue
                        obj = json.loads(data)
                        if "error" in obj:
                            result.setdefault("errors", []).append(obj)
                        if obj.get("usage"):
                            usage = obj["usage"]
                        for c in obj.get("choices", []):
                            text.append(c["delta"].get("content") or "")
                            if c.get("finish_reason"):
                                finishes.append(c["finish_reason"])
        except Exception as e:  # reported below
            result["exception"] = repr(e)
        finally:
            first_chunk.set()
            result.update(text="".join(text), finishes=finishes, usage=usage, done=done)

    try:
        t = threading.Thread(target=consume)
        t.start()
        assert first_chunk.wait(60), "the stream never started"
        server.signal(signal.SIGTERM)
        # New connections are refused soon after the signal, while the stream is still going.
        refused = False
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                httpx.get(server.url + "/health", timeout=1.0)
            except httpx.ConnectError:
                refused = True
                break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        still_streaming = t.is_alive()
        t.join(120)
        assert not t.is_alive()
        assert "exception" not in result, result
        assert "errors" not in result, result
        assert result.get("status") == 200
        assert result["done"], f"stream cut without [DONE]: {result}"
        assert result["finishes"] == ["length"], result
        assert result["usage"] and result["usage"]["completion_tokens"] == 80, result
        assert refused, "the server kept accepting connections after SIGTERM"
        assert still_streaming, "the stream ended before the refusal was checked; lengthen it"
        assert server.wait_exit(30) == 0
    finally:
        server.stop()


# ── (e) Health and metrics ─────────────────────────────────────────────────────────────────

HEALTH_FIELDS = ("status", "uptime_ms", "queued", "running", "kv_pages_total", "kv_pages_free", "connections",
                 "steps", "preemptions", "requests_started", "requests_ok", "requests_failed",
                 "requests_cancelled", "prompt_tokens", "generated_tokens", "prefix_cached_tokens")


def check_health_body(body: dict, ready: bool) -> None:
    for f in HEALTH_FIELDS:
        assert f in body, f"/health lacks {f}: {body}"
        if f != "status":
            assert isinstance(body[f], (int, float)) and body[f] >= 0, f"{f}={body[f]!r}"
    assert body["status"] == ("ok" if ready else "unavailable")
    assert body["kv_pages_free"] <= body["kv_pages_total"]


def test_health_while_loading(gguf):
    server = start_server("startup", gguf, "--kv-memory", "64MiB", wait=False)
    try:
        seen: list[tuple[str, int]] = []
        bodies_503: list[dict] = []
        resets = 0
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and not ready:
            assert server.alive(), server.log_tail()
            for path in ("/health", "/v1/models"):
                try:
                    r = httpx.get(server.url + path, timeout=5)
                except httpx.ConnectError:
                    continue
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    # A connection the loading server accepted in the instant it hands the
                    # socket to the ready one is closed unread (a reset); a client retries.
                    resets += 1
                    continue
                seen.append((path, r.status_code))
                if path == "/health":
                    if r.status_code == 503:
                        bodies_503.append(r.json())
                    elif r.status_code == 200:
                        check_health_body(r.json(), ready=True)
                        ready = True
                        break
            time.sleep(0.01)
        assert ready, f"never ready; saw {seen[-5:]}"
        problems = []
        if resets > 1:
            problems.append(f"{resets} connections reset while loading: only the hand-over may drop one")
        unexpected = sorted({(p, s) for p, s in seen if s >= 500 and not (p == "/health" and s == 503)})
        if unexpected:
            problems.append(f"5xx other than /health's 503 while loading (/v1/models must work): {unexpected}")
        if not all(s in (200, 503) for p, s in seen if p == "/health"):
            problems.append(f"/health answered other than 200/503: {seen}")
        for body in bodies_503[:1]:
            try:
                check_health_body(body, ready=False)
            except AssertionError as e:
                problems.append(f"503 /health body is not the documented shape: {e}")
        if not bodies_503:
            print("loading finished before the first /health answer; only the 200 body was checked")
        assert not problems, "\n".join(problems)
    finally:
        server.stop()


def test_kv_pool_is_mapped_at_start_unless_told_not_to(gguf):
    """`vigil serve` maps its whole KV pool before it answers (as llama-server clears its KV at
    start), so no request pays the page faults of blocks the pool hands out for the first time;
    `--no-kv-prefault` leaves the pool to its first writes. SmolLM2's 256 MiB pool."""
    rss = {}
    for name, flags in (("prefault", ()), ("lazy", ("--no-kv-prefault",))):
        server = start_server(f"kv-{name}", gguf, "--kv-memory", "256MiB", *flags)
        try:
            rss[name] = proc_status_mib(server.proc.pid, "VmRSS")
            log = server.log_tail(1 << 20)
        finally:
            server.stop()
        if name == "prefault":
            assert "mapped at start" in log, log
    print(f"resident after start: {rss}")
    assert rss["prefault"] - rss["lazy"] > 240, rss


METRIC_NAMES = [
    "vigil_requests_total", "vigil_prompt_tokens_total", "vigil_generated_tokens_total",
    "vigil_prefix_cached_tokens_total", "vigil_time_to_first_token_seconds", "vigil_inter_token_latency_seconds",
    "vigil_queue_depth", "vigil_running_sequences", "vigil_kv_blocks_used", "vigil_kv_blocks_free",
    "vigil_prefix_cache_hit_rate", "vigil_preemptions_total", "vigil_step_duration_seconds",
    "vigil_prefill_tokens_per_step",
]


def test_metrics_after_traffic(smol):
    with httpx.Client(timeout=120) as client:
        stream_chat(smol.url, story_body("metrics", max_tokens=6), client)
        client.post(smol.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}], "temperature": 5})
    r = httpx.get(smol.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    samples = prom_samples(r.text)
    names = {n for n, _, _ in samples}
    base = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in names}
    missing = [m for m in METRIC_NAMES if m not in names and m not in base]
    assert not missing, f"missing metrics: {missing}"
    statuses = {ls.get("status") for n, ls, _ in samples if n == "vigil_requests_total"}
    assert None not in statuses and len(statuses) >= 2, f"vigil_requests_total status labels: {statuses}"
    kinds = {ls.get("kind") for n, ls, _ in samples if n.startswith("vigil_step_duration_seconds")}
    assert {"prefill", "decode"} <= kinds, kinds
    assert "# TYPE vigil_time_to_first_token_seconds histogram" in r.text
    ttft_count = prom_value(r.text, "vigil_time_to_first_token_seconds_count")
    assert ttft_count >= 1
    inf = [v for n, ls, v in samples if n == "vigil_time_to_first_token_seconds_bucket" and ls.get("le") == "+Inf"]
    assert inf and inf[0] == ttft_count
    h = smol.wait_idle()
    text = smol.metrics_text()
    assert prom_value(text, "vigil_generated_tokens_total") == h["generated_tokens"]
    assert prom_value(text, "vigil_prompt_tokens_total") == h["prompt_tokens"]
    assert prom_value(text, "vigil_kv_blocks_free") + prom_value(text, "vigil_kv_blocks_used") == h["kv_pages_total"]
    assert prom_value(text, "vigil_running_sequences") == 0
    assert prom_value(text, "vigil_queue_depth") == 0
    rate = prom_value(text, "vigil_prefix_cache_hit_rate")
    assert 0.0 <= rate <= 1.0
