"""Regression tests for the hardening issue: nothing a client sends may stall the server for
others, exhaust it, or keep it alive past its shutdown deadline. Each test drives a real
`vigil serve` (the tiny Qwen3 checkpoint, 128-token context, so context limits are cheap to
reach) over raw sockets and httpx.

Figures asserted here are bounds, not benchmarks: `/health` under 100 ms while two flash
queries cannot be evaluated, idle sockets closed by the header timeout, SIGTERM honoured
within its deadline with a reader that never reads."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
import uuid

import httpx
import pytest

from conftest import TINY, iter_sse, proc_status_mib, prom_samples, session_url, start_server

IDLE_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 16
PENDING_TOTAL = 8192
ALLOWED = "http://ok.test"


@pytest.fixture(scope="module")
def hard():
    server = start_server(
        "hardening", str(TINY / "qwen3"), "--kv-memory", "16MiB",
        "--idle-timeout", str(IDLE_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
        "--max-pending-bytes-total", str(PENDING_TOTAL), "--allowed-origins", ALLOWED,
    )
    yield server
    server.stop()


def sid() -> str:
    return "h" + uuid.uuid4().hex[:12]


def create(server, **body) -> str:
    body.setdefault("id", sid())
    r = httpx.post(server.v1 + "/sessions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return body["id"]


def envelope(r: httpx.Response, status: int) -> dict:
    info = f"{r.request.method} {r.request.url.path} -> {r.status_code} {r.text[:300]!r}"
    assert r.status_code == status, info
    assert r.headers.get("content-type", "").startswith("application/json"), info
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"], info
    return err


def health_ms(client: httpx.Client, n: int = 10) -> float:
    """The slowest of `n` `/health` round trips on one kept-alive connection, in ms."""
    worst = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get("/health")
        worst = max(worst, (time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
    return worst


# ── 1. Flash queries that cannot be answered ──────────────────────────────────────────────


def test_flash_query_too_long_for_the_model_is_refused_at_registration(hard):
    s = create(hard)
    r = httpx.post(session_url(hard, s, "/flash"), json={"query": "why " * 400}, timeout=30)
    err = envelope(r, 400)
    assert err["param"] == "query" and err["code"] == "context_length_exceeded", err
    # Nothing was registered.
    assert httpx.get(session_url(hard, s, "/flash"), timeout=10).json()["data"] == []


def test_unanswerable_flash_queries_park_and_never_stall_the_server(hard):
    """Two sessions whose flash query fits on empty data but not beside the data they then
    hold: each evaluation cannot start, so the query is parked with its error (on the flash
    object and as an `error` event), and `/health` keeps answering under 100 ms."""
    sessions = [create(hard), create(hard)]
    query = " ".join(["why"] * 15)  # ~45 tokens with the tiny tokenizer
    with httpx.Client(base_url=hard.url, timeout=30) as c:
        events = []
        for s in sessions:
            r = c.post(f"/v1/sessions/{s}/flash", json={"query": query})
            assert r.status_code == 200, r.text
        with c.stream("GET", f"/v1/sessions/{sessions[0]}/events") as stream:
            for s in sessions:
                # ~84 tokens of data (under the 96 an append-only session may hold): the
                # opening + data + query pass the 128-token context.
                r = c.post(f"/v1/sessions/{s}/push", json={"data": ["level 41 percent, pump on"] * 4})
                assert r.status_code == 200, r.text
            for event, data in iter_sse(stream):
                events.append((event, json.loads(data)))
                if event == "error":
                    break
        kind, err_event = events[-1]
        assert kind == "error", events
        assert err_event["flash_id"] == 1 and err_event["error_code"] == "context_length_exceeded", err_event
        parked = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(parked) < 2:
            parked = [q for s in sessions for q in c.get(f"/v1/sessions/{s}/flash").json()["data"]
                      if q.get("error")]
            time.sleep(0.05)
        assert len(parked) == 2, parked
        for q in parked:
            assert q["error"]["code"] == "context_length_exceeded" and "value" not in q, q
        assert health_ms(c, 20) < 100
        # Parked means parked: no evaluation is retried until the data moves on.
        m1 = prom(c, "vigil_flash_errors_total")
        time.sleep(0.5)
        assert prom(c, "vigil_flash_errors_total") == m1, "a parked query was retried without new data"
        for s in sessions:
            assert c.delete(f"/v1/sessions/{s}").status_code == 200


def prom(c: httpx.Client, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# ── 2. Connections: header timeout, cap ───────────────────────────────────────────────────


def open_idle(server, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(4096) is not None  # b"" (EOF) or a timeout-closing response
    except (socket.timeout, TimeoutError):
        return False
    except OSError:
        return True


def test_idle_connections_are_closed_by_the_header_timeout(hard):
    """50 sockets that send nothing, and 1 that sent half a request head, are closed once the
    header timeout passes; `/health` answers throughout on its own connection."""
    socks = open_idle(hard, 50)
    half = socket.create_connection(("127.0.0.1", hard.port), timeout=5)
    half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
    try:
        with httpx.Client(base_url=hard.url, timeout=5) as c:
            assert health_ms(c, 5) < 100
        t0 = time.monotonic()
        assert all(closed_by_server(s, IDLE_TIMEOUT_S + 5) for s in socks + [half])
        assert time.monotonic() - t0 < IDLE_TIMEOUT_S + 5
        with httpx.Client(base_url=hard.url, timeout=5) as c:
            assert health_ms(c, 5) < 100
    finally:
        for s in socks + [half]:
            s.close()


def test_keep_alive_connection_idle_past_the_timeout_is_closed(hard):
    s = socket.create_connection(("127.0.0.1", hard.port), timeout=5)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
        s.settimeout(IDLE_TIMEOUT_S + 5)
        rest = b""
        t0 = time.monotonic()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        assert time.monotonic() - t0 < IDLE_TIMEOUT_S + 5
    finally:
        s.close()


def test_past_the_connection_cap_health_answers_and_the_rest_get_503(hard):
    socks = open_idle(hard, MAX_CONNECTIONS)
    try:
        time.sleep(0.2)
        h = httpx.get(hard.url + "/health", timeout=5)
        assert h.status_code == 200 and h.json()["status"] == "ok", h.text
        assert h.headers.get("connection") == "close"
        assert h.json()["connections"] >= MAX_CONNECTIONS
        r = httpx.post(hard.v1 + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       timeout=5)
        err = envelope(r, 503)
        assert "--max-connections" in err["message"]
        assert r.headers.get("retry-after", "").isdigit()
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        r = httpx.get(hard.v1 + "/models", timeout=5)
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert r.status_code == 200, "connections were not given back after the clients left"


# ── 4. A server-wide bound on queued session data ─────────────────────────────────────────


def test_queued_session_bytes_are_bounded_server_wide(hard):
    r = httpx.post(hard.v1 + "/sessions", json={"max_pending_bytes": PENDING_TOTAL + 1}, timeout=10)
    assert envelope(r, 400)["param"] == "max_pending_bytes"
    r = httpx.post(hard.v1 + "/sessions", json={"max_pending": 10**9}, timeout=10)
    assert envelope(r, 400)["param"] == "max_pending"
    # One push whose entries alone pass the server-wide bound is refused whole, in any
    # overflow mode (drop_oldest would otherwise have to drop what it just acknowledged).
    a = create(hard, window=64)
    big = "x" * 2100
    r = httpx.post(session_url(hard, a, "/push"), json={"data": [big] * 4}, timeout=10)
    err = envelope(r, 429)
    assert "--max-pending-bytes-total" in err["message"], err
    assert r.headers.get("retry-after", "").isdigit()
    assert httpx.get(session_url(hard, a), timeout=10).json()["total_pushed"] == 0
    # The refused push took none of the budget: a small one is queued and ingested.
    r = httpx.post(session_url(hard, a, "/push"), json={"data": ["pump on"]}, timeout=10)
    assert r.status_code == 200, r.text
    assert httpx.delete(session_url(hard, a), timeout=10).status_code in (200, 409)


# ── 6. Envelopes ─────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("method,path", [("PUT", "/v1/sessions"), ("DELETE", "/v1/chat/completions"),
                                         ("POST", "/health"), ("PATCH", "/v1/models"),
                                         ("GET", "/v1/messages")])
def test_wrong_method_is_405_in_the_envelope(hard, method, path):
    r = httpx.request(method, hard.url + path, timeout=10)
    if path.startswith("/v1/messages"):
        assert r.status_code == 405 and r.json()["type"] == "error", r.text
    else:
        envelope(r, 405)


@pytest.mark.parametrize("tail", ["", "/flash", "/data", "/push"])
def test_invalid_utf8_in_a_path_id_is_a_json_400(hard, tail):
    method = "POST" if tail == "/push" else "GET"
    r = httpx.request(method, hard.v1 + "/sessions/%ff%fe" + tail, json={"data": "x"}, timeout=10)
    err = envelope(r, 400)
    assert "UTF-8" in err["message"] or "utf-8" in err["message"].lower(), err


def test_413_closes_the_connection(hard):
    big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
    r = httpx.post(hard.v1 + "/completions", content=big, headers={"content-type": "application/json"},
                   timeout=30)
    envelope(r, 413)
    assert r.headers.get("connection") == "close"


# ── 7. Cross-site requests ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_post_without_a_json_content_type_is_415(hard, ctype):
    r = httpx.post(hard.v1 + "/sessions", content=b'{"id": "csrf"}', headers={"content-type": ctype},
                   timeout=10)
    envelope(r, 415)
    assert httpx.get(hard.v1 + "/sessions/csrf", timeout=10).status_code == 404


def test_a_foreign_origin_is_refused_and_an_allowed_one_gets_cors(hard):
    body = {"id": sid()}
    r = httpx.post(hard.v1 + "/sessions", json=body, headers={"origin": "http://evil.test"}, timeout=10)
    envelope(r, 403)
    assert httpx.get(session_url(hard, body["id"]), timeout=10).status_code == 404
    pre = httpx.options(hard.v1 + "/sessions", headers={
        "origin": ALLOWED, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type"}, timeout=10)
    assert pre.status_code == 204, pre.text
    assert pre.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "content-type" in pre.headers["access-control-allow-headers"]
    r = httpx.post(hard.v1 + "/sessions", json=body, headers={"origin": ALLOWED}, timeout=10)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED, r.text
    bad_pre = httpx.options(hard.v1 + "/sessions", headers={
        "origin": "http://evil.test", "access-control-request-method": "POST"}, timeout=10)
    assert bad_pre.status_code == 403 and "access-control-allow-origin" not in bad_pre.headers
    assert httpx.delete(session_url(hard, body["id"]), timeout=10).status_code == 200


# ── 5. Shutdown deadline ─────────────────────────────────────────────────────────────────


def stalled_stream(port: int) -> socket.socket:
    """A streamed completion (minutes long on SmolLM2) whose client never reads: its receive
    buffer is 4 KiB, so the server's writes soon stall."""
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(5)
    stalled.connect(("127.0.0.1", port))
    body = json.dumps({"prompt": "a", "stream": True, "ignore_eos": True, "max_tokens": 100000,
                       "logprobs": 5}).encode()
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    return stalled


def running(server) -> int:
    return httpx.get(server.url + "/health", timeout=10).json()["running"]


def test_sigterm_ends_every_stream_with_a_final_event_and_exits_within_the_deadline(gguf):
    """SmolLM2 (8,192-token context) streams for minutes to one client that never reads and
    one that does; a session event stream is attached. On SIGTERM with a 2 s deadline the event
    stream ends at once with `shutdown`, the reading client's stream ends at the deadline with
    an error frame naming the shutdown then `[DONE]`, and the process exits 0 in time."""
    import threading

    server = start_server("shutdown-deadline", gguf, "--kv-memory", "64MiB",
                          "--shutdown-timeout", "2", "--write-timeout", "60")
    stalled = stalled_stream(server.port)
    seen: dict[str, list] = {"chat": [], "events": []}

    def read_chat():
        body = {"model": "m", "stream": True, "max_tokens": 100000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Count."}]}
        with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=30) as r:
            for _, data in iter_sse(r):
                seen["chat"].append(data)

    def read_events(session_id):
        with httpx.stream("GET", session_url(server, session_id) + "/events", timeout=30) as r:
            for event, data in iter_sse(r):
                seen["events"].append((event, data))

    try:
        session_id = create(server)
        readers = [threading.Thread(target=read_chat, daemon=True),
                   threading.Thread(target=read_events, args=(session_id,), daemon=True)]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 20
        while not (seen["chat"] and seen["events"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen["chat"] and seen["events"], "streams did not start"
        time.sleep(0.5)
        t0 = time.monotonic()
        server.signal(signal.SIGTERM)
        code = server.wait_exit(timeout=15)
        took = time.monotonic() - t0
        for t in readers:
            t.join(timeout=5)
        assert code == 0, server.log_tail()
        assert took < 2 + 3, f"exit took {took:.1f}s with a 2 s deadline"
        assert seen["chat"][-1] == "[DONE]", seen["chat"][-3:]
        err = json.loads(seen["chat"][-2])["error"]
        assert err["code"] == "server_shutdown" and "shutting down" in err["message"], err
        assert seen["events"][-1][0] == "shutdown", seen["events"][-3:]
        assert "shutting down" in json.loads(seen["events"][-1][1])["message"]
    finally:
        stalled.close()
        server.stop()


def test_a_client_that_stops_reading_is_cut_off_by_the_write_timeout(gguf):
    """With `--write-timeout 1`, a streamed completion to a client that never reads is
    disconnected once the socket stops taking bytes: its generation stops (no request is
    running), the client finds a stream cut short (no `[DONE]`), and the server serves others.
    `--send-buffer-bytes 8192` keeps the kernel from buffering megabytes first (on loopback it
    autotunes the send buffer up to 4 MiB, minutes of this stream)."""
    server = start_server("write-timeout", gguf, "--kv-memory", "64MiB", "--write-timeout", "1",
                          "--send-buffer-bytes", "8192")
    stalled = stalled_stream(server.port)
    try:
        deadline = time.monotonic() + 10
        while running(server) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(server) == 1, "the stalled stream never started"
        # 100,000 tokens (capped by the 8,192-token context) take minutes; the socket fills in
        # well under a second of them, then the write deadline passes.
        deadline = time.monotonic() + 20
        while running(server) != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running(server) == 0, "the generation to a stalled reader is still running"
        received = b""
        stalled.settimeout(5)
        while chunk := stalled.recv(1 << 16):
            received += chunk
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        assert b"data: [DONE]" not in received and len(received) > 4096
        r = httpx.post(server.v1 + "/completions", json={"prompt": "a", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        stalled.close()
        server.stop()


# ── 8. Admission is one atomic step ──────────────────────────────────────────────────────


def test_concurrent_arrivals_never_overshoot_the_admission_bound(overload):
    """16 requests released at once on a server admitting one (`--max-seqs 1 --max-queue 0`),
    each long enough that all of them overlap: exactly one is admitted, 15 get 503."""
    import threading

    barrier = threading.Barrier(16)
    statuses: list[int] = []
    body = {"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}

    def one():
        with httpx.Client(timeout=120) as c:
            barrier.wait()
            statuses.append(c.post(overload.v1 + "/chat/completions", json=body).status_code)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] + [503] * 15, statuses
    h = overload.wait_idle()
    assert h["running"] == 0 and h["queued"] == 0, h


# ── 3. Memory while 8 clients send maximum-size prompts ──────────────────────────────────


PEAK_RSS_GROWTH_MIB = 320


def test_peak_rss_stays_bounded_while_8_clients_send_maximum_size_prompts(gguf):
    """8 clients at once, twice over: prompts at the 8 MiB body limit (refused by their byte
    length before tokenizing) and prompts just inside the byte check (tokenized, then refused
    as too long), over completions, chat, /tokenize and session create. The server's peak RSS
    grows by less than PEAK_RSS_GROWTH_MIB (each body is held about once, and at most one
    tokenizer job per core runs), every answer is a 4xx in its envelope, and it still serves."""
    from concurrent.futures import ThreadPoolExecutor

    limit = 8 << 20
    server = start_server("peak-rss", gguf, "--kv-memory", "64MiB", "--max-body-bytes", str(limit))
    try:
        words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
        huge = (words * (limit // len(words)))[: limit - 512]
        # Just inside the byte check (max_model_len × the longest token's bytes): tokenized.
        err = envelope(httpx.post(server.v1 + "/completions", json={"prompt": huge, "max_tokens": 1},
                                  timeout=120), 400)
        assert err["code"] == "context_length_exceeded", err
        m = re.search(r"than the (\d+) tokens .* longest token is (\d+) bytes", err["message"])
        assert m, err["message"]
        inside = huge[: int(m.group(1)) * int(m.group(2)) - 64]
        baseline = proc_status_mib(server.proc.pid, "VmHWM")

        def send(i: int, text: str) -> httpx.Response:
            route, body = [
                ("/v1/completions", {"prompt": text, "max_tokens": 1}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
                ("/tokenize", {"prompt": text}),
                ("/v1/sessions", {"id": sid(), "prompt": text}),
            ][i % 4]
            return httpx.post(server.url + route, json=body, timeout=180)

        for text in (huge, inside):
            with ThreadPoolExecutor(8) as pool:
                replies = list(pool.map(lambda i: send(i, text), range(8)))
            for r in replies:
                if r.request.url.path == "/tokenize" and r.status_code == 200:
                    # Like vLLM's, /tokenize counts a text longer than the context.
                    assert r.json()["count"] > r.json()["max_model_len"], r.text[:300]
                    continue
                assert 400 <= r.status_code < 500, (r.request.url.path, r.status_code, r.text[:300])
                assert r.json()["error"]["message"], r.text[:300]
            print(f"{len(text)} bytes x 8: peak +{proc_status_mib(server.proc.pid, 'VmHWM') - baseline:.0f} MiB")
        growth = proc_status_mib(server.proc.pid, "VmHWM") - baseline
        print(f"peak RSS {baseline:.0f} MiB -> +{growth:.0f} MiB (bound {PEAK_RSS_GROWTH_MIB})")
        assert growth < PEAK_RSS_GROWTH_MIB, f"peak RSS grew by {growth:.0f} MiB"
        r = httpx.post(server.v1 + "/completions", json={"prompt": "a", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        server.stop()


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(v for n, _, v in prom_samples(text) if n == name)


def test_tokenizing_stops_for_clients_that_leave(gguf):
    """8 clients each send a prompt that must be tokenized (just inside the byte check) and
    hang up at once. At most one job per core (2 here) had started before the hang-ups were
    seen; the others never run: a request dropped while it waits for the pool drops its job
    (`vigil_cpu_jobs_abandoned_total` counts the ones that had reached the pool)."""
    server = start_server("client-leaves", gguf, "--kv-memory", "64MiB")
    try:
        words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
        err = envelope(httpx.post(server.v1 + "/completions",
                                  json={"prompt": words * 100_000, "max_tokens": 1}, timeout=120), 400)
        m = re.search(r"than the (\d+) tokens .* longest token is (\d+) bytes", err["message"])
        assert m, err["message"]
        text = (words * 100_000)[: int(m.group(1)) * int(m.group(2)) - 64]
        run0 = metric(server, "vigil_cpu_jobs_run_total")
        gone0 = metric(server, "vigil_cpu_jobs_abandoned_total")
        body = json.dumps({"prompt": text, "max_tokens": 1}).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode())
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(8)]
        for s in socks:
            s.sendall(head + body)
        for s in socks:
            s.close()
        # Each job takes a fraction of a second: 8 of them run in ~2 s if nothing stops them.
        seen, still = None, 0
        while still < 10:
            time.sleep(0.3)
            now = (metric(server, "vigil_cpu_jobs_run_total") - run0,
                   metric(server, "vigil_cpu_jobs_abandoned_total") - gone0)
            still = still + 1 if now == seen else 0
            seen = now
        ran, gone = seen
        print(f"jobs run {ran:.0f}, abandoned {gone:.0f}, of 8 requests whose clients left")
        assert ran + gone <= 8 and ran <= 2, (ran, gone)
        r = httpx.post(server.v1 + "/completions", json={"prompt": "a", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        server.stop()
