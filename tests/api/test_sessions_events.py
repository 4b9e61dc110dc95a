"""Session events on the tiny Qwen3: the SSE stream (`GET /v1/sessions/{id}/events`, dialect B)
and the WebSocket (`GET /v1/sessions/{id}/ws`) through the reference client `layerscale==0.8.0`,
sync and async, plus Vigil's additions over raw httpx / websockets: monotonic event ids,
`Last-Event-ID` resume, `dropped` events, event ids on WS messages, the 16 MiB frame limit, and
the cut-off of a subscriber that stops reading (`lagged`, then the end) on both surfaces.

What is checked: `connected` comes first, cached flash answers are replayed, a push produces
`data_updated` (and on the socket, its `push_ack` first), ping gets pong, a bad message gets a
non-fatal `error`, refused upgrades map to the client's typed errors, and a deleted session ends
its streams."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from typing import Iterator, Optional

import httpx
import layerscale
import pytest
from layerscale.lib.ws import WsConnected, WsDataUpdated, WsError, WsPong, WsPushAck
from layerscale.types import ConnectedEvent, DataUpdatedEvent, FlashReadyEvent
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import API_KEY, RUST_WORDS, session_data, session_get, session_url, settle_session, sse_frames, wait_flash_fresh

READ = httpx.Timeout(10, read=20)  # the events stream is silent for 15 s at most (heartbeats)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def qclient(qwen):
    c = layerscale.LayerScale(base_url=qwen.url, api_key="", max_retries=0, timeout=60)
    yield c
    c.close()


def create(c, server, janitor, **params):
    s = c.sessions.create(**params)
    janitor.track(server, s.id)
    return s


def ws_url(server, sid: str) -> str:
    return "ws://" + server.url.removeprefix("http://") + f"/v1/sessions/{sid}/ws"


class Frame:
    def __init__(self, eid: Optional[str], event: Optional[str], data: str) -> None:
        self.id = int(eid) if eid is not None else None
        self.event = event
        self.data = json.loads(data)

    def __repr__(self) -> str:
        return f"Frame(id={self.id}, {self.event}, {self.data})"


def read_until(frames: Iterator, pred, seen: list) -> Frame:
    """Reads frames into `seen` until one satisfies `pred`; returns it."""
    for eid, event, data in frames:
        f = Frame(eid, event, data)
        seen.append(f)
        if pred(f):
            return f
    raise AssertionError(f"stream ended before the expected frame; saw {seen}")


# ── SSE through the reference client ───────────────────────────────────────────────────────


def test_sse_connected_replay_then_data_updated(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    f = qclient.sessions.flash(s.id, "Latest?", max_tokens=3)
    qclient.sessions.push(s.id, ["e1", "e2"], wait=True)
    cached = wait_flash_fresh(qwen, s.id)["data"][0]
    version = qclient.sessions.get(s.id).data_version
    stream = qclient.sessions.events(s.id, request_options={"timeout": 20})
    try:
        it = iter(stream)
        first = next(it)
        assert isinstance(first, ConnectedEvent), first
        assert first.session_id == s.id and first.data_version == version and first.flash_queries == 1
        replay = next(it)
        assert isinstance(replay, FlashReadyEvent), replay
        assert (replay.id, replay.query, replay.value, replay.data_version, replay.confidence) == \
            (f.id, "Latest?", cached["value"], cached["data_version"], cached["confidence"])
        ack = qclient.sessions.push(s.id, "e3")
        updated = next(e for e in it if isinstance(e, DataUpdatedEvent))
        assert updated.data_version == ack.data_version + 1, (ack, updated)
        assert updated.pending >= 0 and updated.tokens > 0
        now = qclient.sessions.get(s.id)
        assert now.data_version >= updated.data_version and now.tokens >= updated.tokens
    finally:
        stream.close()


def test_sse_async_client(qwen):
    async def main() -> None:
        async with layerscale.AsyncLayerScale(base_url=qwen.url, api_key="", max_retries=0, timeout=30) as c:
            s = await c.sessions.create()
            try:
                stream = await c.sessions.events(s.id, request_options={"timeout": 20})
                it = stream.__aiter__()
                first = await asyncio.wait_for(it.__anext__(), 20)
                assert isinstance(first, ConnectedEvent) and first.session_id == s.id
                assert first.flash_queries == 0 and first.data_version == 0
                ack = await c.sessions.push(s.id, ["x1", "x2"])
                while True:
                    ev = await asyncio.wait_for(it.__anext__(), 20)
                    if isinstance(ev, DataUpdatedEvent):
                        break
                assert ev.data_version == ack.data_version + 1
                await stream.close()
                with pytest.raises(layerscale.NotFoundError):
                    await c.sessions.events("sess_missing_events")
            finally:
                await c.sessions.delete(s.id)

    asyncio.run(main())


def test_sse_stream_ends_when_session_deleted(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    stream = qclient.sessions.events(s.id, request_options={"timeout": 20})
    it = iter(stream)
    assert isinstance(next(it), ConnectedEvent)
    # An event stream is not a foreground request: it does not hold off a delete.
    assert qclient.sessions.delete(s.id).deleted is True
    started = time.monotonic()
    rest = list(it)  # ends (rather than timing out) once the session is gone
    assert time.monotonic() - started < 15
    assert not any(isinstance(e, DataUpdatedEvent) for e in rest), rest
    with pytest.raises(layerscale.NotFoundError):
        qclient.sessions.events(s.id)


# ── SSE wire details (Vigil): ids, Last-Event-ID, dropped ──────────────────────────────────


def test_sse_ids_increase_and_last_event_id_resumes(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    url = session_url(qwen, s.id, "/events")
    updates: list[Frame] = []
    with httpx.Client(timeout=READ) as hc:
        seen: list[Frame] = []
        with hc.stream("GET", url) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            frames = sse_frames(r)
            first = read_until(frames, lambda f: True, seen)
            assert first.event == "connected" and "type" not in first.data, first
            for i in range(3):
                v = qclient.sessions.push(s.id, f"line {i}", wait=True).data_version
                updates.append(read_until(
                    frames, lambda f, v=v: f.event == "data_updated" and f.data["data_version"] > v, seen))
        ids = [f.id for f in seen if f.id is not None]
        assert all(f.id is not None for f in seen if f.event != "connected"), seen
        assert ids == sorted(set(ids)), f"event ids not strictly increasing: {seen}"

        # Resume after the first update: only the later two are replayed, then live events.
        resumed: list[Frame] = []
        with hc.stream("GET", url, headers={"Last-Event-ID": str(updates[0].id)}) as r:
            assert r.status_code == 200
            frames = sse_frames(r)
            read_until(frames, lambda f: f.event == "data_updated" and f.id == updates[2].id, resumed)
            ack = qclient.sessions.push(s.id, "line 3", wait=True)
            live = read_until(frames, lambda f: f.event == "data_updated" and f.data["data_version"] > ack.data_version,
                              resumed)
        later = [f for f in resumed if f.event != "connected"]
        assert all(f.id is not None and f.id > updates[0].id for f in later), resumed
        replayed = [f for f in later if f.event == "data_updated" and f.id <= updates[2].id]
        assert [(f.id, f.data) for f in replayed] == [(u.id, u.data) for u in updates[1:]], resumed
        assert [f.id for f in later] == sorted(set(f.id for f in later)), resumed
        assert live.id > updates[2].id


def test_sse_dropped_event(qwen, janitor):
    s = janitor.create(qwen, max_pending=2)
    url = session_url(qwen, s["id"], "")
    seen: list[Frame] = []
    with httpx.Client(timeout=READ) as hc:
        with hc.stream("GET", url + "/events") as r:
            assert r.status_code == 200
            frames = sse_frames(r)
            read_until(frames, lambda f: f.event == "connected", seen)
            ack = hc.post(url + "/push", json={"data": [f"d{i}" for i in range(6)]}).json()
            assert ack["dropped"] >= 4, ack
            read_until(frames, lambda f: f.event == "data_updated", seen)
    dropped = [f for f in seen if f.event == "dropped"]
    assert dropped, f"no dropped event: {seen}"
    first_update = next(i for i, f in enumerate(seen) if f.event == "data_updated")
    assert seen.index(dropped[0]) < first_update, "the drop is reported before the ingest it preceded"
    assert sum(f.data["dropped"] for f in dropped) == ack["dropped"]
    assert dropped[-1].data["total_dropped"] == ack["total_dropped"]
    assert all(isinstance(f.data["data_version"], int) for f in dropped)
    settled, data = settle_session(qwen, s["id"])
    assert settled["total_dropped"] == ack["dropped"]
    assert data["entries"] == [f"d{i}" for i in range(6)][ack["dropped"]:]


# ── WebSocket through the reference client ─────────────────────────────────────────────────


@pytest.mark.timeout(60)
def test_ws_sync_push_ack_then_data_updated_and_pong(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    with qclient.sessions.ws(s.id) as ws:
        it = iter(ws)
        first = next(it)
        assert isinstance(first, WsConnected), first
        assert first.data.session_id == s.id and first.data.data_version == 0 and first.data.flash_queries == 0
        ws.push(["w1", "w2"])
        after: list = []
        while not (after and isinstance(after[-1], WsDataUpdated)):
            after.append(next(it))
        assert isinstance(after[0], WsPushAck), f"push_ack must precede the push's events: {after}"
        ack = after[0].data
        assert (ack.pushed, ack.dropped, ack.total_pushed, ack.total_dropped) == (2, 0, 2, 0)
        assert after[-1].data.data_version > ack.data_version
        ws.ping()
        pong = next(e for e in it if not isinstance(e, WsDataUpdated))
        assert isinstance(pong, WsPong), pong
        ws.push("w3")
        ack3 = next(e for e in it if not isinstance(e, WsDataUpdated))
        assert isinstance(ack3, WsPushAck) and ack3.data.pushed == 1 and ack3.data.total_pushed == 3
    _, data = settle_session(qwen, s.id)
    assert data["entries"] == ["w1", "w2", "w3"]


def test_ws_async_client(qwen):
    async def main() -> None:
        async with layerscale.AsyncLayerScale(base_url=qwen.url, api_key="", max_retries=0, timeout=30) as c:
            s = await c.sessions.create()
            try:
                f = await c.sessions.flash(s.id, "Next?", max_tokens=2)
                async with c.sessions.ws(s.id) as ws:
                    it = ws.__aiter__()

                    async def nxt():
                        return await asyncio.wait_for(it.__anext__(), 20)

                    first = await nxt()
                    assert isinstance(first, WsConnected) and first.data.flash_queries == 1
                    await ws.push("a1")
                    ack = await nxt()
                    assert isinstance(ack, WsPushAck) and ack.data.pushed == 1, ack
                    ev = await nxt()
                    while not isinstance(ev, WsDataUpdated):
                        ev = await nxt()
                    assert ev.data.data_version > ack.data.data_version
                    await ws.ping()
                    ev = await nxt()
                    while not isinstance(ev, WsPong):
                        assert not isinstance(ev, WsError), ev
                        ev = await nxt()
                assert (await c.sessions.get(s.id)).model_extra["total_pushed"] == 1
                assert f.id in [q.id for q in (await c.sessions.list_flash(s.id)).data]
                with pytest.raises(layerscale.NotFoundError):
                    async with c.sessions.ws("sess_missing_ws"):
                        pass
            finally:
                await c.sessions.delete(s.id)

    asyncio.run(main())


# ── WebSocket wire details ─────────────────────────────────────────────────────────────────


BAD_MESSAGES = ["not json", json.dumps([1, 2]), json.dumps({"type": "frobnicate"}), json.dumps({"type": "push"}),
                json.dumps({"type": "push", "data": []}), json.dumps({"type": "push", "data": 5}), "null",
                json.dumps({"type": 5})]


@pytest.mark.timeout(60)
def test_ws_bad_messages_are_non_fatal(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    with ws_connect(ws_url(qwen, s.id)) as conn:
        def recv() -> dict:
            return json.loads(conn.recv(timeout=20))

        assert recv()["type"] == "connected"
        for bad in BAD_MESSAGES:
            conn.send(bad)
            msg = recv()
            assert msg["type"] == "error", (bad, msg)
            err = msg["data"]
            assert isinstance(err["message"], str) and err["message"], msg
            assert err["code"] == 400, msg
            # JSON's words, not serde's names for Rust types.
            assert not RUST_WORDS.search(err["message"]), msg
        conn.send(json.dumps({"type": "ping"}))
        assert recv()["type"] == "pong"
        updates = []
        for line in ("ok1", "ok2"):
            conn.send(json.dumps({"type": "push", "data": [line]}))
            ack = recv()
            assert ack["type"] == "push_ack" and ack["data"]["pushed"] == 1, ack
            msg = recv()
            while msg["type"] != "data_updated":
                msg = recv()
            updates.append(msg)
        # Vigil: replayable events carry their bus id beside the payload (a flash_ready
        # payload's own `id` is the query's).
        assert all(isinstance(u.get("event_id"), int) for u in updates), updates
        assert updates[0]["event_id"] < updates[1]["event_id"]
    _, data = settle_session(qwen, s.id)
    assert data["entries"] == ["ok1", "ok2"], "a refused message was ingested"


def test_ws_refused_upgrades_are_typed(qclient, qwen, keyed):
    with pytest.raises(layerscale.NotFoundError):
        qclient.sessions.ws("sess_missing_ws")
    with pytest.raises(layerscale.BadRequestError):
        qclient.sessions.ws("bad!id")

    auth = {"authorization": f"Bearer {API_KEY}"}
    r = httpx.post(keyed.v1 + "/sessions", json={}, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    try:
        for key in ("", "wrong"):
            with layerscale.LayerScale(base_url=keyed.url, api_key=key, max_retries=0) as c:
                with pytest.raises(layerscale.AuthenticationError) as e:
                    c.sessions.ws(sid)
                assert e.value.status_code == 401 and e.value.type == "authentication_error"
        with layerscale.LayerScale(base_url=keyed.url, api_key=API_KEY, max_retries=0) as c:
            with c.sessions.ws(sid) as ws:
                it = iter(ws)
                first = next(it)
                assert isinstance(first, WsConnected) and first.data.session_id == sid
                ws.ping()
                assert isinstance(next(it), WsPong)
    finally:
        httpx.delete(session_url(keyed, sid), headers=auth, timeout=30)


def test_events_do_not_change_data(qwen, janitor):
    """Opening and closing streams is read-only: the session's data and version stay put."""
    s = janitor.create(qwen)
    r = httpx.post(session_url(qwen, s["id"], "/push"), json={"data": ["v1"]}, timeout=30)
    assert r.status_code == 200
    before, data = settle_session(qwen, s["id"])
    for _ in range(2):
        with httpx.Client(timeout=READ) as hc, hc.stream("GET", session_url(qwen, s["id"], "/events")) as resp:
            first = next(sse_frames(resp))
            assert first[1] == "connected"
            assert json.loads(first[2])["data_version"] == before["data_version"]
    after = session_data(qwen, s["id"])
    assert after == data


def test_ws_frame_over_16_mib_ends_the_connection(qclient, qwen, janitor):
    """An inbound frame over 16 MiB tears the socket down (no error event); the session is
    untouched and a new socket works."""
    s = create(qclient, qwen, janitor)
    with ws_connect(ws_url(qwen, s.id), max_size=None) as conn:
        assert json.loads(conn.recv(timeout=10))["type"] == "connected"
        big = json.dumps({"type": "push", "data": "x" * (16 * 1024 * 1024 + 16)})
        with pytest.raises(Exception):
            conn.send(big)
            while True:
                msg = json.loads(conn.recv(timeout=10))
                assert msg["type"] != "push_ack", "an oversized frame was accepted"
    assert qclient.sessions.get(s.id).model_extra["total_pushed"] == 0
    with ws_connect(ws_url(qwen, s.id)) as conn:
        assert json.loads(conn.recv(timeout=10))["type"] == "connected"


# ── Slow subscribers and keep-alives ───────────────────────────────────────────────────────

# Events a stalled reader is sent before it must be cut off: the bus's 512 plus what the socket
# buffers and hyper's queue absorb. With the small client socket below that is ~600 events on
# the machines seen so far; a kernel whose send buffer grows further absorbs more, so a flood
# that a stalled reader got every event of (no lag) is repeated 8× larger.
FLOODS = (4000, 32000)


def slow_socket(server) -> socket.socket:
    """A client socket that holds little: small receive buffer and segments, so a subscriber
    that does not read stalls the server's writes after a few kilobytes."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect((host, int(port)))
    return sock


def flood_events(server, sid: str, n: int, window: int = 64) -> list:
    """Publishes `n` events cheaply over a WebSocket that keeps up: in a session created with
    `max_pending_bytes=1` every entry overflows the queue, so each push is one `dropped` event
    and nothing reaches the engine. Up to `window` pushes are in flight at once; the socket is
    subscribed too, and the server sends its events before reading its next push, so it gets
    every ack and every event, and stays open (a ping is answered at the end). Returns the ids
    of the events it got, in arrival order."""
    with ws_connect(ws_url(server, sid), max_queue=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "connected"
        sent, acks, events = 0, 0, []
        while acks < n or len(events) < n:
            while sent < n and sent - acks < window:
                ws.send(json.dumps({"type": "push", "data": [f"f{sent}"]}))
                sent += 1
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] in ("push_ack", "dropped"), msg
            if msg["type"] == "push_ack":
                assert msg["data"]["dropped"] == 1, msg
                acks += 1
            else:
                events.append(msg["event_id"])
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
    return events


def test_a_producer_that_pipelines_pushes_is_not_lagged_by_its_own_events(qwen, janitor):
    """64 pushes in flight on one socket, which is also subscribed: every ack and every event
    arrives, in order, and the socket stays open."""
    s = janitor.create(qwen, max_pending_bytes=1)
    n = 3000
    events = flood_events(qwen, s["id"], n)
    assert events == sorted(events) and len(set(events)) == n


def sse_events_until_end(sock: socket.socket, flood: int) -> Optional[bytes]:
    """The raw response until the chunked body's end; None when every one of `flood` events
    arrived and the stream then went quiet: the buffers held them all, and nothing lagged."""
    raw = b""
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        all_sent = raw.count(b"event: ") >= flood + 1  # `connected` and the flood
        sock.settimeout(3 if all_sent else 20)
        try:
            chunk = sock.recv(1 << 16)
        except socket.timeout:
            if all_sent:
                return None
            raise
        assert chunk, f"connection closed before the body ended: {raw[-300:]!r}"
        raw += chunk
    return raw


def test_sse_reader_that_stops_reading_gets_lagged_then_the_end(qwen, janitor):
    for flood in FLOODS:
        s = janitor.create(qwen, max_pending_bytes=1)
        sock = slow_socket(qwen)
        try:
            sock.sendall(f"GET /v1/sessions/{s['id']}/events HTTP/1.1\r\nHost: vigil\r\n\r\n".encode())
            time.sleep(0.2)  # subscribed (the response head is written at once)
            flood_events(qwen, s["id"], flood)
            raw = sse_events_until_end(sock, flood)
        finally:
            sock.close()
        if raw is not None:
            break
    assert raw is not None, f"a reader that stopped was sent all of {FLOODS[-1]} events, never lagged"
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
    events = [line[len(b"event: "):].decode() for line in body.split(b"\n") if line.startswith(b"event: ")]
    assert events[0] == "connected", events[:3]
    assert events[-1] == "lagged", events[-5:]
    assert events.count("lagged") == 1
    delivered = len(events) - 2
    assert 0 < delivered < flood, f"{delivered} events delivered of {flood}: the reader was not cut off"
    missed = json.loads(body[body.rindex(b"data: ") + 6:].split(b"\n")[0])["missed"]
    assert missed > 0
    # Cut off, not stuck: the session has no stream attached any more and still serves.
    assert session_get(qwen, s["id"])["subscribers"] == 0


def ws_kinds_until_close(ws, flood: int) -> Optional[list]:
    """Event kinds until the server closes; None when every one of `flood` events arrived and
    the socket then went quiet (the buffers held them all, and nothing lagged)."""
    kinds: list = []
    while True:
        all_sent = len(kinds) >= flood + 1
        try:
            kinds.append(json.loads(ws.recv(timeout=3 if all_sent else 20))["type"])
        except ConnectionClosed:
            return kinds
        except TimeoutError:
            if all_sent:
                return None
            raise


def test_ws_reader_that_stops_reading_gets_lagged_then_close(qwen, janitor):
    for flood in FLOODS:
        s = janitor.create(qwen, max_pending_bytes=1)
        with ws_connect(ws_url(qwen, s["id"]), sock=slow_socket(qwen), max_queue=1) as slow:
            flood_events(qwen, s["id"], flood)
            kinds = ws_kinds_until_close(slow, flood)
        if kinds is not None:
            break
    assert kinds is not None, f"a reader that stopped was sent all of {FLOODS[-1]} events, never lagged"
    assert kinds[0] == "connected", kinds[:3]
    assert kinds[-1] == "lagged", kinds[-5:]
    assert 0 < len(kinds) - 2 < flood, f"{len(kinds) - 2} events delivered of {flood}"
    assert session_get(qwen, s["id"])["subscribers"] == 0


@pytest.mark.timeout(60)
def test_idle_streams_are_kept_alive_every_15_seconds(qclient, qwen, janitor, caplog):
    """An idle SSE stream gets a `: heartbeat` comment and an idle socket a ping within 15 s
    (the client answers the ping, which also keeps the server's 30 s read deadline at bay)."""
    s = create(qclient, qwen, janitor)
    caplog.set_level(logging.DEBUG, logger="websockets.client")
    with ws_connect(ws_url(qwen, s.id)) as ws, httpx.Client(timeout=READ) as hc:
        assert json.loads(ws.recv(timeout=10))["type"] == "connected"
        with hc.stream("GET", session_url(qwen, s.id, "/events")) as r:
            started = time.monotonic()
            lines = r.iter_lines()
            assert next(lines).startswith("event: connected")
            line = next(l for l in lines if l.startswith(":"))
            assert line == ": heartbeat"
            assert 14 < time.monotonic() - started < 17
        pings = [rec for rec in caplog.records if "< PING" in rec.getMessage()]
        assert pings, [rec.getMessage() for rec in caplog.records]
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
