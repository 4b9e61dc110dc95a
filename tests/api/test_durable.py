"""Durable sessions through the real server (`--state-dir`): pushes acknowledged in a loop
survive `kill -9` at random moments, in order and without duplicates; flash queries come back
and answer as before the crash; event ids go on past the client's `Last-Event-ID`; a torn log
tail restores to its last whole record; export/import moves a session between servers.

The model is the tiny Qwen3 checkpoint with an 8,192-token context (random weights, greedy
answers are still deterministic), so the test spends its time on the journal, not on compute."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import TINY, VigilServer, settle_session, tiny_qwen3_with_context, session_data, session_get, session_url, sse_frames, start_server

SEED = int(os.environ.get("VIGIL_TEST_SEED", "20261202"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3 checkpoint with an 8,192-token context."""
    return tiny_qwen3_with_context(tmp_path_factory.mktemp("tiny-qwen3-8k"), 8192)


def serve(name: str, model: Path, state: Path, *args: str):
    return start_server(name, str(model), "--kv-memory", "64MiB", "--state-dir", str(state), *args)


def crash_and_restart(server) -> None:
    """kill -9, then start the same command (same port, same state directory)."""
    server.signal(signal.SIGKILL)
    server.wait_exit(10)
    server.start().wait_ready()


def create(server, **body) -> dict:
    r = httpx.post(server.v1 + "/sessions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def add_flash(server, sid: str, query: str) -> int:
    r = httpx.post(session_url(server, sid, "/flash"), json={"query": query, "max_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def flash_answers(server, sid: str, version: int, timeout: float = 60.0) -> dict:
    """Every flash query's answer once all are evaluated at `version`: {query: value}."""
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(session_url(server, sid, "/flash"), timeout=30).json()
        qs = body["data"]
        if qs and all(q.get("data_version") == version for q in qs):
            return {q["query"]: q["value"] for q in qs}
        assert time.monotonic() < deadline, f"flash answers of {sid} not at version {version}: {body}"
        time.sleep(0.05)


def test_acknowledged_pushes_survive_kill_9_at_random_moments(model_dir, tmp_path):
    rng = random.Random(SEED)
    server = serve("durable-crash", model_dir, tmp_path / "state")
    sids = ["crash-a", "crash-b", "crash-c"]
    try:
        for sid in sids:
            create(server, id=sid)
        add_flash(server, "crash-a", "What was the last entry?")
        # What each session was sent, in order, and what of it was acknowledged.
        sent = {sid: [] for sid in sids}
        acked = {sid: [] for sid in sids}
        for kill_round in range(4):
            stop = threading.Event()

            def pusher(sid: str) -> None:
                with httpx.Client(timeout=10) as c:
                    for i in range(0, 120, 2):
                        if stop.is_set():
                            return
                        batch = [f"{sid} round {kill_round} entry {i}", f"{sid} round {kill_round} entry {i + 1}"]
                        sent[sid].extend(batch)
                        try:
                            r = c.post(session_url(server, sid, "/push"), json={"data": batch})
                        except httpx.HTTPError:
                            return
                        assert r.status_code == 200, r.text
                        acked[sid].extend(batch)
                        time.sleep(0.005)

            threads = [threading.Thread(target=pusher, args=(sid,)) for sid in sids]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.1, 0.8))
            server.signal(signal.SIGKILL)
            server.wait_exit(10)
            stop.set()
            for t in threads:
                t.join(30)
            if kill_round == 3:
                # A power cut mid-write: the newest log segment loses a random part of its tail.
                wal = sorted((tmp_path / "state").glob("wal-*.log"))[-1]
                size = wal.stat().st_size
                cut = rng.randrange(max(13, size - 200), size + 1)
                with open(wal, "r+b") as f:
                    f.truncate(cut)
            server.start().wait_ready()
            for sid in sids:
                s, d = settle_session(server, sid)
                entries = d["entries"]
                n_acked = len(acked[sid])
                if kill_round < 3:
                    assert entries[:n_acked] == acked[sid], f"round {kill_round}: {sid} lost an acknowledged entry"
                assert entries == sent[sid][: len(entries)], f"round {kill_round}: {sid} holds entries out of order or twice"
                assert s["total_pushed"] == len(entries) and s["total_dropped"] == 0, s
                # What survived is the new baseline (a push in flight at the kill may have landed).
                sent[sid] = list(entries)
                acked[sid] = list(entries)
            assert sum(len(v) for v in acked.values()) > 0
        log = server.log_tail(20000)
        assert "restored 3 of 3 session(s)" in log, log
        # The flash query came back and answers at the restored version.
        s = session_get(server, "crash-a")
        assert flash_answers(server, "crash-a", s["data_version"])
    finally:
        server.stop()


def test_flash_answers_and_event_ids_are_the_same_after_a_crash(model_dir, tmp_path):
    server = serve("durable-flash", model_dir, tmp_path / "state")
    try:
        create(server, id="watch", window=160, evict_to=80)
        queries = ["Which entry came last?", "How many ticks?"]
        for q in queries:
            add_flash(server, "watch", q)
        for i in range(0, 40, 4):
            r = httpx.post(session_url(server, "watch", "/push"),
                           json={"data": [f"tick {k}: value {k * 13 % 97}" for k in range(i, i + 4)], "wait": True},
                           timeout=60)
            assert r.status_code == 200 and r.json()["resident"], r.text
        before, data_before = settle_session(server, "watch")
        assert data_before["evicted"] > 0, "the window evicted entries"
        answers_before = flash_answers(server, "watch", before["data_version"])
        # The newest event id a client has seen: every buffered event is replayed at once, then
        # the stream is quiet.
        last_id = 0
        try:
            with httpx.stream("GET", session_url(server, "watch", "/events"), headers={"Last-Event-ID": "0"},
                              timeout=httpx.Timeout(30, read=1.5)) as r:
                for ev_id, _, _ in sse_frames(r):
                    if ev_id is not None:
                        last_id = max(last_id, int(ev_id))
        except httpx.ReadTimeout:
            pass
        assert last_id > 0

        crash_and_restart(server)

        after, data_after = settle_session(server, "watch")
        assert data_after == data_before
        for k in ("data_version", "total_pushed", "total_ingested", "evicted", "evicted_tokens",
                  "window_recomputes", "flash_queries", "tokens"):
            assert after[k] == before[k], (k, before, after)
        # Served at once from the journal, then evaluated again on the rebuilt KV: the same.
        assert flash_answers(server, "watch", after["data_version"]) == answers_before
        deadline = time.monotonic() + 60
        while True:
            qs = httpx.get(session_url(server, "watch", "/flash"), timeout=30).json()["data"]
            if all(q["evaluations"] >= 1 for q in qs):
                break
            assert time.monotonic() < deadline, qs
            time.sleep(0.05)
        assert {q["query"]: q["value"] for q in qs} == answers_before
        # A client resuming from its last event id gets the next event, numbered after it.
        with httpx.stream("GET", session_url(server, "watch", "/events"),
                          headers={"Last-Event-ID": str(last_id)}, timeout=30) as r:
            httpx.post(session_url(server, "watch", "/push"), json={"data": "after the crash"}, timeout=30)
            for ev_id, event, data in sse_frames(r):
                if event == "data_updated":
                    assert int(ev_id) > last_id, (ev_id, last_id)
                    break
    finally:
        server.stop()


def test_export_and_import_move_a_session_between_servers(model_dir, tmp_path):
    a = serve("durable-export-a", model_dir, tmp_path / "a")
    b = serve("durable-export-b", model_dir, tmp_path / "b")
    other = start_server("durable-export-other", str(TINY / "llama"), "--kv-memory", "16MiB", "--no-persist")
    try:
        create(a, id="mover", window=120)
        add_flash(a, "mover", "What moved?")
        r = httpx.post(session_url(a, "mover", "/push"),
                       json={"data": [f"crate {k} moved to bay {k % 5}" for k in range(30)], "wait": True}, timeout=60)
        assert r.status_code == 200, r.text
        s_a, d_a = settle_session(a, "mover")
        answers = flash_answers(a, "mover", s_a["data_version"])

        exported = httpx.get(session_url(a, "mover", "/export"), timeout=30)
        assert exported.status_code == 200, exported.text
        snap = exported.json()
        assert snap["object"] == "session.export" and snap["session"]["id"] == "mover"

        r = httpx.post(b.v1 + "/sessions/import", json=snap, timeout=60)
        assert r.status_code == 200, r.text
        s_b, d_b = settle_session(b, "mover")
        assert d_b == d_a
        assert s_b["data_version"] == s_a["data_version"]
        assert flash_answers(b, "mover", s_b["data_version"]) == answers

        # Imported twice: the id is taken.
        r = httpx.post(b.v1 + "/sessions/import", json=snap, timeout=30)
        assert r.status_code == 409, r.text
        # Under another id it is a second session.
        r = httpx.post(b.v1 + "/sessions/import", json={**snap, "id": "mover-2"}, timeout=60)
        assert r.status_code == 200, r.text
        # The import is durable: it survives a crash of the server it moved to.
        crash_and_restart(b)
        assert session_data(b, "mover") == d_a
        # Another model refuses it, naming both.
        r = httpx.post(other.v1 + "/sessions/import", json=snap, timeout=30)
        assert r.status_code == 400, r.text
        assert "same model" in r.json()["error"]["message"]
        # Bad records are 400s naming the problem.
        bad = json.loads(json.dumps(snap))
        bad["session"]["base"] = [10**9]
        r = httpx.post(a.v1 + "/sessions/import", json={**bad, "id": "bad-1"}, timeout=30)
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"], r.text
        r = httpx.post(a.v1 + "/sessions/import", json={**snap, "format": 99, "id": "bad-2"}, timeout=30)
        assert r.status_code == 400 and "format" in r.json()["error"]["message"], r.text
        r = httpx.post(a.v1 + "/sessions/import", json={"session": {}}, timeout=30)
        assert r.status_code == 400, r.text
        assert httpx.get(session_url(a, "nope", "/export"), timeout=30).status_code == 404
    finally:
        for s in (a, b, other):
            s.stop()


def test_a_second_server_on_the_same_state_dir_is_refused(model_dir, tmp_path):
    first = serve("durable-lock-1", model_dir, tmp_path / "state")
    try:
        second = VigilServer("durable-lock-2", str(model_dir), ["--kv-memory", "64MiB", "--state-dir", str(tmp_path / "state")])
        second.start()
        code = second.wait_exit(60)
        assert code != 0
        assert "in use by another vigil server" in second.log_tail(), second.log_tail()
    finally:
        first.stop()


def test_an_agent_conversation_resumes_after_a_crash(model_dir, tmp_path):
    # No prefix cache: what a turn reuses comes from its own session's KV alone.
    server = serve("durable-agent", model_dir, tmp_path / "state", "--no-prefix-cache")
    try:
        def turn(sid, msgs):
            r = httpx.post(server.v1 + "/chat/completions", headers={"x-layerscale-session-id": sid}, timeout=60,
                           json={"model": "m", "messages": msgs, "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()

        # The same two turns on two sessions; only the first crashes between them.
        first = {}
        for sid in ("agent", "control"):
            create(server, id=sid)
            first[sid] = turn(sid, [{"role": "user", "content": "List three colours."}])
        before = session_get(server, "agent")
        assert before["turns"] == 1
        crash_and_restart(server)
        after = session_get(server, "agent")
        for k in ("turns", "tokens", "data_version"):
            assert after[k] == before[k], (k, before, after)
        # Once its KV is rebuilt, the next turn reuses what the uncrashed one does.
        deadline = time.monotonic() + 30
        for sid in ("agent", "control"):
            while session_get(server, sid)["kv_tokens"] + 1 < after["tokens"]:
                assert time.monotonic() < deadline, session_get(server, sid)
                time.sleep(0.05)
        second = {}
        for sid in ("agent", "control"):
            msgs = [{"role": "user", "content": "List three colours."}, first[sid]["choices"][0]["message"],
                    {"role": "user", "content": "And two more."}]
            second[sid] = turn(sid, msgs)
            assert session_get(server, sid)["turns"] == 2
        assert first["agent"]["choices"] == first["control"]["choices"]
        assert second["agent"]["choices"] == second["control"]["choices"]
        assert second["agent"]["usage"] == second["control"]["usage"]
        assert second["agent"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        server.stop()


def test_idle_kv_written_to_disk_is_read_back_after_a_crash(model_dir, tmp_path):
    state = tmp_path / "state"
    server = serve("durable-kv", model_dir, state, "--kv-disk", "256MiB")
    try:
        create(server, id="held")
        add_flash(server, "held", "Which entry came first?")
        r = httpx.post(session_url(server, "held", "/push"),
                       json={"data": [f"reading {k}: {k * 7 % 31} units" for k in range(60)], "wait": True},
                       timeout=60)
        assert r.status_code == 200 and r.json()["resident"], r.text
        before, data_before = settle_session(server, "held")
        answers = flash_answers(server, "held", before["data_version"])
        # Quiet for 2 s: the KV goes to disk.
        kv_file = state / "kv" / "held.kv"
        deadline = time.monotonic() + 30
        while not kv_file.exists():
            assert time.monotonic() < deadline, "no KV file was written"
            time.sleep(0.1)
        crash_and_restart(server)
        after, data_after = settle_session(server, "held")
        assert data_after == data_before
        log = server.log_tail(20000)
        m = re.search(r"KV of (\d+) tokens read back from disk", log)
        assert m and int(m.group(1)) >= before["tokens"] - 1, log
        assert flash_answers(server, "held", after["data_version"]) == answers
        # A deleted session's KV file goes with it.
        assert httpx.delete(session_url(server, "held"), timeout=30).status_code == 200
        deadline = time.monotonic() + 10
        while kv_file.exists():
            assert time.monotonic() < deadline, "the KV file outlived its session"
            time.sleep(0.05)
    finally:
        server.stop()
