"""Stateful sessions (`/v1/sessions/*`) through the reference client `layerscale==0.8.0`, sync and
async, with raw httpx for Vigil's extensions (docs/sessions.md) and for wire details the client
hides: lifecycle, push acks and backpressure, generate and its exactness against a stateless chat
of the same rendering, warm turns, flash queries, sliding windows, agent turns, every error status
the client maps, isolation and KV accounting, idle expiry, and auth.

SmolLM2 (`smol`) carries every test whose answer is compared token for token; the tiny random
Qwen3 (`qwen`) carries the fast ones that check shapes, ordering and counts."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import layerscale
import openai
import pytest
from layerscale.types import GenerationDone, GenerationTextChunk

from conftest import (
    API_KEY,
    iter_sse,
    prom_samples,
    prom_value,
    session_data,
    session_get,
    session_url,
    settle_session,
    start_server,
    wait_flash_fresh,
)

SYSTEM_P = "You watch a live weather feed. Answer in one short sentence."
WEATHER = [
    "09:00 Oslo 4 C, wind 12 km/h", "09:05 Oslo 5 C, wind 10 km/h", "09:10 Oslo 7 C, rain starts",
    "09:15 Oslo 6 C, heavy rain", "09:20 Oslo 6 C, rain easing", "09:25 Oslo 8 C, sun breaks through",
]
Q_TEMP = "What is the latest temperature in Oslo?"
Q_RAIN = "Is it raining? Answer yes or no."
Q_NOW = "What is the weather like now?"
LOG = [f"Reading {i + 1}: tank level {40 + 3 * i} percent" for i in range(12)]  # 11-12 tokens each
Q_LOG = "What was the last tank level?"
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
MIB4 = 4 * 1024 * 1024


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def client(smol):
    c = layerscale.LayerScale(base_url=smol.url, api_key="", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def qclient(qwen):
    c = layerscale.LayerScale(base_url=qwen.url, api_key="", max_retries=0, timeout=120)
    yield c
    c.close()


def create(c: layerscale.LayerScale, server, janitor, **params):
    """Creates through the client (extra keyword arguments travel in the body unchanged, which is
    how Vigil's create fields such as `prompt` are sent) and hands the session to the janitor."""
    s = c.sessions.create(**params)
    janitor.track(server, s.id)
    return s


def user_turn(entries: list[str], question: str) -> str:
    """The user message a session's data plus a question renders as (docs/sessions.md)."""
    return "".join(e + "\n" for e in entries) + question


def stateless(c: layerscale.LayerScale, prompt, entries: list[str], question: str, max_tokens: int):
    messages = [] if prompt is None else [{"role": "system", "content": prompt}]
    messages.append({"role": "user", "content": user_turn(entries, question)})
    return c.chat.create(messages=messages, max_tokens=max_tokens, temperature=0)


def assert_same_answer(gen, chat, what: str) -> None:
    """A session generate equals the stateless chat completion token for token."""
    info = f"{what}: session {gen.text!r} ({gen.usage}) vs stateless {chat.choices[0].message.content!r} ({chat.usage})"
    assert gen.text == (chat.choices[0].message.content or ""), info
    assert gen.usage.completion_tokens == chat.usage.completion_tokens, info
    assert gen.finish_reason == chat.choices[0].finish_reason, info
    assert gen.usage.prompt_tokens == chat.usage.prompt_tokens, f"different rendering: {info}"


def raw(server, method: str, path: str, body=None, headers=None, timeout: float = 60) -> httpx.Response:
    return httpx.request(method, server.url + path, json=body, headers=headers, timeout=timeout)


def check_error(r: httpx.Response, status: int, names=()) -> dict:
    """Asserts the status and the OpenAI error envelope; `names` must appear in `param` or the message."""
    info = f"{r.request.method} {r.request.url.path} -> {r.status_code} {r.text[:400]!r}"
    assert r.status_code == status, info
    err = r.json().get("error")
    assert isinstance(err, dict), info
    assert isinstance(err.get("message"), str) and err["message"], info
    assert isinstance(err.get("type"), str) and err["type"], info
    if isinstance(names, str):
        names = (names,)
    for n in names:
        assert n in (err.get("param") or "") or n in err["message"], f"error does not name {n!r}: {info}"
    return err


def delete_when_free(c: layerscale.LayerScale, sid: str, timeout: float = 10.0):
    """Deletes a session whose last request is being cancelled (409 until it is)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return c.sessions.delete(sid)
        except layerscale.ConflictError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_kv_free(server, expected: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    h = server.wait_idle()
    while h["kv_pages_free"] != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        h = server.health()
    return h


# ── Lifecycle ──────────────────────────────────────────────────────────────────────────────


def test_create_get_list_delete(client, smol, janitor):
    now = time.time()
    named = create(client, smol, janitor, id=uid("life"))
    assert ID_RE.match(named.id)
    assert named.object == "session"
    assert abs(named.created - now) < 10
    assert named.last_used >= named.created
    assert (named.turns, named.data_version, named.pending, named.evicted) == (0, 0, 0, 0)
    assert named.busy is False and named.pre_decode is False and named.ready is False
    assert named.window is None and named.ready_token is None and named.ready_gap is None
    assert 0 <= named.kv_tokens <= named.tokens and named.data_end <= named.tokens

    generated = create(client, smol, janitor)
    other = create(client, smol, janitor)
    for s in (generated, other):
        assert s.id.startswith("sess_") and ID_RE.match(s.id), s.id
    assert generated.id != other.id

    windowed = create(client, smol, janitor, window=64, pre_decode=True)
    assert windowed.window == 64 and windowed.pre_decode is True
    if windowed.ready:
        assert isinstance(windowed.ready_token, int) and isinstance(windowed.ready_gap, float)

    got = client.sessions.get(named.id)
    assert (got.id, got.created, got.data_end) == (named.id, named.created, named.data_end)

    listing = client.sessions.list()
    assert listing.object == "list"
    listed = [s.id for s in listing.data]
    mine = [named.id, generated.id, other.id, windowed.id]
    assert [i for i in listed if i in mine] == mine, listed

    gone = client.sessions.delete(named.id)
    assert gone.id == named.id and gone.deleted is True and gone.object
    for call in (lambda: client.sessions.get(named.id), lambda: client.sessions.delete(named.id),
                 lambda: client.sessions.push(named.id, "x"),
                 lambda: client.sessions.generate(named.id, prompt="hi", max_tokens=1),
                 lambda: client.sessions.list_flash(named.id)):
        with pytest.raises(layerscale.NotFoundError) as e:
            call()
        assert e.value.status_code == 404 and named.id in e.value.message
    assert named.id not in [s.id for s in client.sessions.list().data]


def test_list_is_sorted_by_creation_then_id(client, smol, janitor):
    # Ids in reverse lexical order, created a few ms apart: creation time must win over the id.
    ids = [uid("order-c"), uid("order-b"), uid("order-a")]
    for i in ids:
        create(client, smol, janitor, id=i)
        time.sleep(0.01)
    data = client.sessions.list().data
    assert [s.id for s in data if s.id in ids] == ids
    keys = [s.created for s in data]
    assert keys == sorted(keys), keys


def test_session_reports_vigil_fields(smol, janitor):
    plain = janitor.create(smol)
    assert plain["overflow"] == "drop_oldest"
    assert plain["max_pending"] == 4096 and plain["max_pending_bytes"] == MIB4
    for field in ("pending_bytes", "total_pushed", "total_dropped", "total_ingested", "evicted_tokens",
                  "window_recomputes"):
        assert plain[field] == 0, (field, plain)
    assert isinstance(plain["prompt_tokens"], int) and plain["prompt_tokens"] >= 0

    tuned = janitor.create(smol, prompt=SYSTEM_P, overflow="reject", max_pending=7, max_pending_bytes=1000)
    assert tuned["overflow"] == "reject"
    assert tuned["max_pending"] == 7 and tuned["max_pending_bytes"] == 1000
    assert tuned["prompt_tokens"] > 0
    assert tuned["data_end"] >= tuned["prompt_tokens"]
    assert tuned["data_version"] == 0


def test_duplicate_id_is_409(client, smol, janitor):
    sid = uid("dup")
    create(client, smol, janitor, id=sid)
    with pytest.raises(layerscale.ConflictError) as e:
        client.sessions.create(id=sid)
    assert e.value.status_code == 409 and sid in e.value.message
    assert [s.id for s in client.sessions.list().data].count(sid) == 1


def test_id_of_128_allowed_characters_is_accepted(client, smol, janitor):
    sid = ("Az09_-" * 22)[:128]
    s = create(client, smol, janitor, id=sid)
    assert s.id == sid
    assert client.sessions.get(sid).id == sid


# ── Push ───────────────────────────────────────────────────────────────────────────────────


def test_push_acks_and_wait(client, smol, janitor):
    s = create(client, smol, janitor)
    a1 = client.sessions.push(s.id, "first line")
    assert (a1.pushed, a1.dropped, a1.total_pushed, a1.total_dropped) == (1, 0, 1, 0)
    assert 0 <= a1.pending <= 1
    assert a1.data_version == 0, "an ack is immediate: nothing is ingested yet"
    a2 = client.sessions.push(s.id, ["second line", "third line"], wait=True)
    assert (a2.pushed, a2.dropped, a2.total_pushed, a2.total_dropped) == (2, 0, 3, 0)
    all_bytes = sum(len(e.encode()) + 1 for e in ["first line", "second line", "third line"])
    for a in (a1, a2):
        assert 0 <= a.pending_bytes <= all_bytes
        assert (a.pending == 0) == (a.pending_bytes == 0), a
    after = client.sessions.get(s.id)
    assert after.pending == 0 and after.data_version > a2.data_version >= 0
    assert after.kv_tokens + 1 >= after.data_end > s.data_end
    settled, data = settle_session(smol, s.id)
    assert data == {"entries": ["first line", "second line", "third line"], "evicted": 0}
    assert settled["total_pushed"] == 3 and settled["pending_bytes"] == 0

    a3 = client.sessions.push(s.id, "fourth line", wait=True)
    assert a3.data_version == settled["data_version"]
    again = client.sessions.get(s.id)
    assert again.data_version > a3.data_version and again.data_end > after.data_end
    assert session_data(smol, s.id)["entries"][-1] == "fourth line"


def test_http_push_wait_answers_once_the_entries_are_resident(client, smol, janitor):
    """Vigil's `wait: true` on the HTTP push: the ack comes when the entries are in the KV, and
    a generate asking for that `data_version` answers over them."""
    s = create(client, smol, janitor)
    r = raw(smol, "POST", f"/v1/sessions/{s.id}/push", {"data": ["12:00 pump on", "12:05 pump off"], "wait": True})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["resident"] is True and a["pending"] == 0 and a["data_version"] >= 1, a
    assert (a["pushed"], a["total_pushed"], a["total_dropped"]) == (2, 2, 0), a
    got = client.sessions.get(s.id)
    assert got.data_version == a["data_version"] and got.kv_tokens + 1 >= got.data_end, got
    assert session_data(smol, s.id)["entries"] == ["12:00 pump on", "12:05 pump off"]

    # Without waiting, a generate that asks for the next version waits for the batch.
    ack = raw(smol, "POST", f"/v1/sessions/{s.id}/push", {"data": "12:10 pump on"}).json()
    assert ack["data_version"] == a["data_version"] and "resident" not in ack, ack
    body = {"prompt": "Is the pump on?", "max_tokens": 4, "temperature": 0, "min_data_version": ack["data_version"] + 1}
    r = raw(smol, "POST", f"/v1/sessions/{s.id}/generate", body)
    assert r.status_code == 200, r.text
    assert r.json()["data_version"] >= ack["data_version"] + 1, r.json()
    assert session_data(smol, s.id)["entries"][-1] == "12:10 pump on"


def test_flash_query_asked_before_its_first_answer_waits_for_the_evaluation(client, smol, janitor):
    """A generate matching a flash query that has no answer yet, while its evaluation is due,
    is answered by that evaluation (flash: true), not by a second generation."""
    s = create(client, smol, janitor)
    q = "Is any sensor above 30 C? Answer yes or no."
    f = client.sessions.flash(s.id, query=q, max_tokens=4)
    client.sessions.push(s.id, ["12:00 sensor-1 21.5 C", "12:01 sensor-2 31.2 C"], wait=True)
    g = client.sessions.generate(s.id, prompt=q)
    assert g.flash is True and g.flash_id == f.id, g
    listed = next(x for x in client.sessions.list_flash(s.id).data if x.id == f.id)
    assert listed.value == g.text and listed.data_version == g.data_version >= 1, (listed, g)


def test_pending_bytes_limit_drops_oldest(qwen, janitor):
    s = janitor.create(qwen, max_pending_bytes=40)
    entries = [f"entry{i:04d}" for i in range(10)]  # 9 bytes each, 90 in all
    r = raw(qwen, "POST", f"/v1/sessions/{s['id']}/push", {"data": entries})
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["pushed"] == 10 and ack["dropped"] >= 5, ack
    assert ack["pending_bytes"] <= 40, ack
    settled, data = settle_session(qwen, s["id"])
    assert settled["total_dropped"] == ack["dropped"]
    assert data["entries"] == entries[len(entries) - len(data["entries"]):], "drop_oldest keeps the newest"
    assert len(data["entries"]) == 10 - ack["dropped"]


def test_push_flood_drop_oldest_keeps_order(qwen, janitor):
    """Pushes arrive faster than ingest (and some single pushes exceed the queue): nothing is
    reordered or duplicated, what was kept is what was acknowledged minus what was dropped."""
    max_pending = 8
    s = janitor.create(qwen, max_pending=max_pending)
    sid = s["id"]
    pushed, acks = [], []
    with httpx.Client(timeout=30) as hc:
        for k in range(20):
            n = 12 if k % 5 == 4 else 4
            batch = [f"f{len(pushed) + i}" for i in range(n)]
            r = hc.post(session_url(qwen, sid, "/push"), json={"data": batch})
            assert r.status_code == 200, r.text
            ack = r.json()
            pushed += batch
            acks.append(ack)
            assert ack["pushed"] == n and ack["total_pushed"] == len(pushed), ack
            assert ack["pending"] <= max_pending, ack
            if n > max_pending:
                assert ack["dropped"] >= n - max_pending, ack
    totals = [a["total_dropped"] for a in acks]
    assert totals == sorted(totals)
    assert totals[-1] == sum(a["dropped"] for a in acks)
    settled, data = settle_session(qwen, sid)
    assert settled["total_pushed"] == len(pushed)
    assert settled["total_dropped"] == totals[-1] >= 4 * 4
    kept = data["entries"]
    assert data["evicted"] == 0
    assert len(kept) == len(pushed) - settled["total_dropped"]
    positions = [int(e[1:]) for e in kept]
    assert all(pushed[p] == e for p, e in zip(positions, kept)), "an entry was altered"
    assert positions == sorted(set(positions)), "entries reordered or duplicated"
    assert kept[-1] == pushed[-1], "the newest entry is never the oldest pending one"
    h = qwen.wait_idle()
    assert h["running"] == 0


def test_reject_overflow_is_429_and_loses_nothing(qwen, qclient, janitor):
    s = janitor.create(qwen, overflow="reject", max_pending=4)
    sid = s["id"]
    push_url = session_url(qwen, sid, "/push")
    accepted, refused = [], []

    def check_429(r: httpx.Response) -> None:
        check_error(r, 429)
        ra = r.headers.get("retry-after")
        assert ra is not None and ra.strip().isdigit(), f"Retry-After: {ra!r}"

    with httpx.Client(timeout=30) as hc:
        oversize = [f"big{i}" for i in range(5)]  # more than max_pending in one push: always refused
        r = hc.post(push_url, json={"data": oversize})
        check_429(r)
        refused.append(oversize)
        for i in range(0, 60, 3):
            batch = [f"r{j}" for j in range(i, i + 3)]
            r = hc.post(push_url, json={"data": batch})
            if r.status_code == 429:
                check_429(r)
                refused.append(batch)
                continue
            assert r.status_code == 200, r.text
            ack = r.json()
            assert ack["dropped"] == 0 and ack["total_dropped"] == 0 and ack["pending"] <= 4, ack
            accepted.append(batch)
    with pytest.raises(layerscale.RateLimitError) as e:
        qclient.sessions.push(sid, [f"big{i}" for i in range(5, 10)])
    assert e.value.status_code == 429
    assert accepted, "every push was refused"
    settled, data = settle_session(qwen, sid)
    expected = [x for b in accepted for x in b]
    assert data["entries"] == expected
    assert settled["total_dropped"] == 0
    assert settled["total_pushed"] == len(expected)
    refused_entries = {x for b in refused for x in b}
    assert not refused_entries & set(data["entries"])


# ── Generate: exactness against the stateless chat ─────────────────────────────────────────


@pytest.mark.parametrize("prompt", [SYSTEM_P, None], ids=["prompt", "no-prompt"])
def test_generate_equals_stateless_chat(client, smol, janitor, prompt):
    params = {} if prompt is None else {"prompt": prompt}
    s = create(client, smol, janitor, **params)
    empty = client.sessions.generate(s.id, prompt=Q_NOW, max_tokens=8, temperature=0)
    assert_same_answer(empty, stateless(client, prompt, [], Q_NOW, 8), "no data")

    client.sessions.push(s.id, WEATHER[:2], wait=True)
    client.sessions.push(s.id, WEATHER[2:4], wait=True)
    sess, data = settle_session(smol, s.id)
    assert data["entries"] == WEATHER[:4]
    g = client.sessions.generate(s.id, prompt=Q_TEMP, max_tokens=12, temperature=0)
    assert_same_answer(g, stateless(client, prompt, WEATHER[:4], Q_TEMP, 12), "4 entries")
    assert g.session_id == s.id and g.id and g.object
    assert g.data_version == sess["data_version"]
    assert g.usage.completion_tokens >= 1 and g.text
    u = g.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None
    cached = u.prompt_tokens_details.cached_tokens
    assert sess["data_end"] - 1 <= cached < u.prompt_tokens, (cached, sess["data_end"], u)
    assert g.flash is None and g.speculative is None

    chunks = list(client.sessions.generate_stream(s.id, prompt=Q_TEMP, max_tokens=12, temperature=0))
    assert chunks and isinstance(chunks[-1], GenerationDone)
    assert all(isinstance(ch, GenerationTextChunk) for ch in chunks[:-1])
    done = chunks[-1]
    assert "".join(ch.text for ch in chunks[:-1]) == g.text
    assert (done.finish_reason, done.data_version, done.session_id) == (g.finish_reason, g.data_version, s.id)
    assert done.usage.completion_tokens == u.completion_tokens and done.usage.prompt_tokens == u.prompt_tokens

    # The question and answer were an ephemeral tail: more data follows the data, not the answer.
    client.sessions.push(s.id, WEATHER[4:6], wait=True)
    sess2, data2 = settle_session(smol, s.id)
    assert data2["entries"] == WEATHER[:6]
    assert sess2["data_version"] > sess["data_version"]
    g2 = client.sessions.generate(s.id, prompt=Q_RAIN, max_tokens=8, temperature=0)
    assert_same_answer(g2, stateless(client, prompt, WEATHER[:6], Q_RAIN, 8), "after more data")
    assert g2.data_version == sess2["data_version"]


def test_generate_stream_wire_format(smol, janitor):
    s = janitor.create(smol)
    r = raw(smol, "POST", f"/v1/sessions/{s['id']}/push", {"data": WEATHER[:2]})
    assert r.status_code == 200, r.text
    settle_session(smol, s["id"])
    body = {"prompt": Q_TEMP, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", session_url(smol, s["id"], "/generate"), json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = [(event, data) for event, data in iter_sse(resp)]
    assert all(event is None for event, _ in frames), "dialect A has no event: lines"
    datas = [d for _, d in frames]
    assert datas[-1] == "[DONE]" and "[DONE]" not in datas[:-1]
    objs = [json.loads(d) for d in datas[:-1]]
    assert 1 <= len(objs) - 1 <= 6
    assert all(set(o) == {"text"} and isinstance(o["text"], str) for o in objs[:-1]), objs
    done = objs[-1]
    assert done["done"] is True and "text" not in done
    assert done["session_id"] == s["id"] and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 6
    assert "flash" not in done and "speculative" not in done


def test_generates_run_alongside_and_delete_waits_for_them(client, smol, janitor):
    s = create(client, smol, janitor)
    client.sessions.push(s.id, WEATHER[:2], wait=True)
    stream = client.sessions.generate_stream(s.id, prompt="Tell a long story.", max_tokens=400,
                                             ignore_eos=True, temperature=0)
    try:
        chunks = iter(stream)  # keep it referenced: a dropped iterator closes the response
        first = next(chunks)
        assert isinstance(first, GenerationTextChunk)
        assert client.sessions.get(s.id).busy is True
        # Generates run on forks of the session: a second one does not wait for the first (Vigil).
        other = client.sessions.generate(s.id, prompt=Q_TEMP, max_tokens=2, temperature=0)
        assert other.usage.completion_tokens >= 1
        with pytest.raises(layerscale.ConflictError) as e:
            client.sessions.delete(s.id)
        assert e.value.status_code == 409
    finally:
        stream.close()
    assert delete_when_free(client, s.id).deleted is True
    with pytest.raises(layerscale.NotFoundError):
        client.sessions.get(s.id)


# ── Warm turns and agent turns ─────────────────────────────────────────────────────────────


def test_warm_then_covered_then_turn_resumes(client, smol, janitor):
    s = create(client, smol, janitor)
    msgs = [{"role": "system", "content": SYSTEM_P}, {"role": "user", "content": "Name a color."}]
    w = client.sessions.warm(s.id, messages=msgs)
    assert w.finish_reason == "warmed", w
    assert w.session_id == s.id and w.id and w.object
    assert w.prompt_tokens > 0
    assert 0 <= w.prefix_cached_tokens <= w.cached_tokens <= w.prompt_tokens
    again = client.sessions.warm(s.id, messages=msgs)
    assert again.finish_reason == "covered", again
    assert again.prompt_tokens == again.cached_tokens == w.prompt_tokens
    assert again.data_version == w.data_version
    turn = client.chat.create(messages=msgs, max_tokens=4, temperature=0, session_id=s.id)
    assert turn.usage.prompt_tokens == w.prompt_tokens
    assert turn.usage.prompt_tokens_details.cached_tokens >= w.prompt_tokens - 1
    assert client.sessions.get(s.id).turns == 1


def test_turns_reuse_the_session(client, smol, janitor):
    oai = openai.OpenAI(base_url=smol.v1, api_key="unused", max_retries=0, timeout=120)
    model = smol.model_info()["id"]
    s = create(client, smol, janitor)
    hdr = {"x-layerscale-session-id": s.id}
    conv = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colors."}]
    r1 = oai.chat.completions.create(model=model, messages=conv, max_tokens=10, temperature=0, extra_headers=hdr)
    s1 = client.sessions.get(s.id)
    assert s1.turns == 1 and s1.data_version > s.data_version
    assert s1.data_end >= r1.usage.prompt_tokens
    conv += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "Now three fruits."}]
    r2 = oai.chat.completions.create(model=model, messages=conv, max_tokens=10, temperature=0, extra_headers=hdr)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens, (r1.usage, r2.usage)
    s2 = client.sessions.get(s.id)
    assert s2.turns == 2 and s2.data_version > s1.data_version
    alone = oai.chat.completions.create(model=model, messages=conv, max_tokens=10, temperature=0)
    assert r2.choices[0].message.content == alone.choices[0].message.content
    assert r2.usage.completion_tokens == alone.usage.completion_tokens
    assert r2.usage.prompt_tokens == alone.usage.prompt_tokens

    # /v1/messages turns share the same session.
    conv3 = conv[1:] + [{"role": "assistant", "content": r2.choices[0].message.content},
                        {"role": "user", "content": "And three animals."}]
    m = client.messages.create(system=conv[0]["content"], messages=conv3, max_tokens=6, temperature=0,
                               session_id=s.id)
    assert m.usage.cache_read_input_tokens >= r2.usage.prompt_tokens, m.usage
    assert client.sessions.get(s.id).turns == 3

    r = raw(smol, "POST", "/v1/chat/completions", {"messages": conv, "max_tokens": 1, "session_id": s.id})
    check_error(r, 400, "session_id")
    assert client.sessions.get(s.id).turns == 3
    oai.close()


def test_busy_turn_conflicts(client, smol, janitor):
    s = create(client, smol, janitor)
    hdr = {"x-layerscale-session-id": s.id}
    long = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 400,
            "ignore_eos": True, "temperature": 0, "stream": True}
    short = [{"role": "user", "content": "hi"}]

    with httpx.Client(timeout=60) as hc:
        with hc.stream("POST", smol.v1 + "/chat/completions", json=long, headers=hdr) as r:
            assert r.status_code == 200
            events = iter_sse(r)
            _event, data = next(events)
            assert data != "[DONE]"
            assert client.sessions.get(s.id).busy is True
            second = raw(smol, "POST", "/v1/chat/completions", {"messages": short, "max_tokens": 1}, headers=hdr)
            check_error(second, 409)
            with pytest.raises(layerscale.ConflictError):
                client.chat.create(messages=short, max_tokens=1, session_id=s.id)
            with pytest.raises(layerscale.ConflictError):
                client.sessions.warm(s.id, messages=short)
            with pytest.raises(layerscale.ConflictError) as e:
                client.sessions.delete(s.id)
            assert e.value.status_code == 409
    # Closing the stream cancels the turn and frees the session.
    assert delete_when_free(client, s.id).deleted is True


# ── Flash queries ──────────────────────────────────────────────────────────────────────────


def flash_counters(server) -> dict:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    names = ("vigil_flash_drafts_total", "vigil_flash_verified_total", "vigil_flash_draft_tokens_total")
    return {n: v for n, _, v in prom_samples(text) if n in names}


def test_reevaluations_verify_the_previous_answer_and_still_equal_a_cold_generate(client, smol, janitor):
    """After the first answer, each evaluation first scores the previous answer as a draft in
    one pass (`vigil_flash_drafts_total`), keeps what the model still picks and decodes only
    past it. The answer must be exactly a cold greedy generate's at the same version, whatever
    part of the draft held."""
    s = create(client, smol, janitor, prompt=SYSTEM_P)
    f = client.sessions.flash(s.id, Q_TEMP, max_tokens=10)
    client.sessions.push(s.id, WEATHER[:3], wait=True)
    wait_flash_fresh(smol, s.id)
    before = flash_counters(smol)
    for n in (4, 5, 6):
        client.sessions.push(s.id, WEATHER[n - 1:n], wait=True)
        settle_session(smol, s.id)
        wait_flash_fresh(smol, s.id)
        q = next(x for x in client.sessions.list_flash(s.id).data if x.id == f.id)
        cold = client.sessions.generate(s.id, prompt=Q_TEMP, max_tokens=10, temperature=0, use_flash=False)
        assert cold.data_version == q.data_version
        assert cold.text == q.value, f"after {n} entries: flash {q.value!r} vs cold {cold.text!r}"
    after = flash_counters(smol)
    drafts = after["vigil_flash_drafts_total"] - before["vigil_flash_drafts_total"]
    assert drafts >= 3, (before, after)
    print("draft tokens kept:", after["vigil_flash_draft_tokens_total"] - before["vigil_flash_draft_tokens_total"],
          "verified in one pass:", after["vigil_flash_verified_total"] - before["vigil_flash_verified_total"])



def test_flash_answer_equals_cold_generate(client, smol, janitor):
    s = create(client, smol, janitor, prompt=SYSTEM_P)
    f = client.sessions.flash(s.id, Q_TEMP, max_tokens=10)
    assert f.query == Q_TEMP and f.max_tokens == 10 and f.tokens > 0 and f.object
    client.sessions.push(s.id, WEATHER[:4], wait=True)
    sess, data = settle_session(smol, s.id)
    assert data["entries"] == WEATHER[:4]
    wait_flash_fresh(smol, s.id)
    listing = client.sessions.list_flash(s.id)
    assert listing.object == "list" and len(listing.data) == 1
    q = listing.data[0]
    assert q.id == f.id and q.fresh is True
    assert isinstance(q.value, str) and isinstance(q.confidence, float) and q.confidence >= 0
    assert isinstance(q.evaluated_at, int) and abs(q.evaluated_at - time.time()) < 120
    assert q.data_version == listing.data_version == client.sessions.get(s.id).data_version
    extra = q.model_extra or {}
    assert extra.get("lag") == 0 and extra.get("evaluations", 0) >= 1, extra
    assert extra.get("skipped", -1) >= 0 and extra.get("eval_ms", -1) >= 0, extra

    cold = client.sessions.generate(s.id, prompt=Q_TEMP, max_tokens=10, temperature=0, use_flash=False)
    assert not cold.flash
    assert cold.text == q.value, f"flash {q.value!r} vs cold {cold.text!r}"
    assert cold.data_version == q.data_version
    assert cold.usage.prompt_tokens > 0 and cold.usage.completion_tokens >= 1
    assert stateless(client, SYSTEM_P, WEATHER[:4], Q_TEMP, 10).choices[0].message.content == q.value

    hit = client.sessions.generate(s.id, prompt=Q_TEMP)
    assert hit.flash is True and hit.flash_id == f.id
    assert hit.text == q.value and hit.confidence == q.confidence and hit.data_version == q.data_version
    assert hit.usage.prompt_tokens == 0 and hit.usage.completion_tokens == 0
    assert hit.usage.total_tokens is None and hit.usage.prompt_tokens_details is None
    assert hit.finish_reason in ("stop", "length")
    assert (hit.model_extra or {}).get("lag") == 0 and (hit.model_extra or {}).get("stale") is False

    chunks = list(client.sessions.generate_stream(s.id, prompt=Q_TEMP))
    done = chunks[-1]
    assert isinstance(done, GenerationDone) and done.flash is True and done.flash_id == f.id
    assert "".join(c.text for c in chunks[:-1]) == q.value

    by_id = raw(smol, "POST", f"/v1/sessions/{s.id}/generate", {"flash_id": f.id})
    assert by_id.status_code == 200, by_id.text
    b = by_id.json()
    assert b["flash"] is True and b["flash_id"] == f.id and b["text"] == q.value
    assert b["usage"]["prompt_tokens"] == 0 and "total_tokens" not in b["usage"]
    assert "prompt_tokens_details" not in b["usage"]
    check_error(raw(smol, "POST", f"/v1/sessions/{s.id}/generate", {"flash_id": f.id + 1000}), 404)


def test_flash_register_list_unflash(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    default = qclient.sessions.flash(s.id, "Status?")
    assert default.max_tokens == 32
    # The answer's four fields come together or not at all; fresh needs an answer.
    present = [default.value is not None, default.data_version is not None, default.confidence is not None,
               default.evaluated_at is not None]
    assert all(present) or not any(present), default
    assert default.fresh is False or default.value is not None
    low = qclient.sessions.flash(s.id, "Low?", max_tokens=0)
    high = qclient.sessions.flash(s.id, "High?", max_tokens=1000)
    assert low.max_tokens == 1 and high.max_tokens == 256
    assert len({default.id, low.id, high.id}) == 3
    with pytest.raises(layerscale.ConflictError) as e:
        qclient.sessions.flash(s.id, "Status?", max_tokens=4)
    assert e.value.status_code == 409
    listing = qclient.sessions.list_flash(s.id)
    assert [q.id for q in listing.data] == [default.id, low.id, high.id]
    assert [q.max_tokens for q in listing.data] == [32, 1, 256]
    assert listing.data_version == qclient.sessions.get(s.id).data_version
    gone = qclient.sessions.unflash(s.id, high.id)
    assert gone.id == high.id and gone.deleted is True and gone.remaining == 2 and gone.object
    with pytest.raises(layerscale.NotFoundError):
        qclient.sessions.unflash(s.id, high.id)
    with pytest.raises(layerscale.NotFoundError):
        qclient.sessions.unflash(s.id, 999_999)
    assert [q.id for q in qclient.sessions.list_flash(s.id).data] == [default.id, low.id]
    # The query may be registered again once deleted.
    assert qclient.sessions.flash(s.id, "High?", max_tokens=2).max_tokens == 2


def test_flash_limit_is_20(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    made = [qclient.sessions.flash(s.id, f"Question {i}?", max_tokens=1) for i in range(20)]
    with pytest.raises((layerscale.BadRequestError, layerscale.ConflictError)) as e:
        qclient.sessions.flash(s.id, "Question 20?", max_tokens=1)
    assert "20" in e.value.message, e.value.message
    assert len(qclient.sessions.list_flash(s.id).data) == 20
    assert qclient.sessions.unflash(s.id, made[0].id).remaining == 19
    assert qclient.sessions.flash(s.id, "Question 20?", max_tokens=1).query == "Question 20?"


def test_flash_min_data_version_and_max_staleness(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor)
    f = qclient.sessions.flash(s.id, "Latest?", max_tokens=4)
    qclient.sessions.push(s.id, ["r1", "r2"], wait=True)
    wait_flash_fresh(qwen, s.id)
    gen_url = f"/v1/sessions/{s.id}/generate"

    ack = qclient.sessions.push(s.id, ["r3"])
    target = ack.data_version + 1
    r = raw(qwen, "POST", gen_url, {"prompt": "Latest?", "min_data_version": target})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["flash"] is True and j["flash_id"] == f.id, j
    assert j["data_version"] >= target, j
    assert j["lag"] == 0 and j["stale"] is False, j
    q = next(x for x in qclient.sessions.list_flash(s.id).data if x.id == f.id)
    assert q.data_version == j["data_version"] and q.value == j["text"]

    qclient.sessions.push(s.id, ["r4"], wait=True)
    v = qclient.sessions.get(s.id).data_version
    r = raw(qwen, "POST", gen_url, {"prompt": "Latest?", "max_staleness": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["flash"] is True and j["data_version"] == v and j["lag"] == 0 and j["stale"] is False, j

    # Without a freshness demand an answer may be stale, but it says so consistently.
    qclient.sessions.push(s.id, ["r5"])
    j = raw(qwen, "POST", gen_url, {"prompt": "Latest?"}).json()
    assert j["flash"] is True and j["lag"] >= 0 and j["stale"] == (j["lag"] > 0), j


# ── Sliding window ─────────────────────────────────────────────────────────────────────────


def test_window_evicts_whole_oldest_entries_exactly(client, smol, janitor):
    window = 64
    fresh = janitor.create(smol, prompt=SYSTEM_P)
    opening = fresh["data_end"]
    # evict_to = window: evict exactly as much as needed (the default evicts to half).
    w = janitor.create(smol, prompt=SYSTEM_P, window=window, evict_to=window)
    assert w["window"] == window and w["evict_to"] == window and w["data_end"] == opening
    for batch in (LOG[0:4], LOG[4:8], LOG[8:12]):
        client.sessions.push(w["id"], batch, wait=True)
    ws, wd = settle_session(smol, w["id"])
    ev = ws["evicted"]
    assert ev > 0 and wd["evicted"] == ev
    assert wd["entries"] == LOG[ev:], (ev, wd)
    assert ws["data_end"] - opening <= window, ws
    assert ws["evicted_tokens"] > 0 and ws["window_recomputes"] >= 1, ws

    # Only as many entries as needed were evicted: one more would not have fit.
    scratch = janitor.create(smol, prompt=SYSTEM_P)
    client.sessions.push(scratch["id"], LOG[ev - 1:], wait=True)
    ss, _ = settle_session(smol, scratch["id"])
    assert ss["data_end"] - opening > window, (ev, ss)

    client.sessions.push(fresh["id"], LOG[ev:], wait=True)
    fs, fd = settle_session(smol, fresh["id"])
    assert fd["entries"] == wd["entries"]
    assert fs["data_end"] == ws["data_end"], "windowed mirror differs from a fresh one of the same entries"
    gw = client.sessions.generate(w["id"], prompt=Q_LOG, max_tokens=10, temperature=0)
    gf = client.sessions.generate(fresh["id"], prompt=Q_LOG, max_tokens=10, temperature=0)
    assert (gw.text, gw.usage.completion_tokens, gw.usage.prompt_tokens) == \
        (gf.text, gf.usage.completion_tokens, gf.usage.prompt_tokens), (gw, gf)
    assert_same_answer(gw, stateless(client, SYSTEM_P, LOG[ev:], Q_LOG, 10), "windowed")


def test_pre_decode_ready_position_and_speculative_exit(client, smol, janitor):
    """With `pre_decode`, the session's ready position (its data followed by the generation
    prompt) is computed with each batch: `ready_token` is the token a stateless chat of the same
    conversation would start with, `ready_gap` its logit gap; a `fast_answer` candidate starting
    with that token is served from it when the gap clears `gap_threshold`, and not otherwise."""
    s = create(client, smol, janitor, pre_decode=True)
    assert s.ready is False and s.ready_token is None
    entries = ["Is the sky blue on a clear day? Answer Yes or No."]
    client.sessions.push(s.id, entries, wait=True)
    got = client.sessions.get(s.id)
    assert got.ready is True and isinstance(got.ready_token, int) and got.ready_gap > 0, got
    chat = client.chat.create(
        messages=[{"role": "user", "content": user_turn(entries, "")}],
        max_tokens=1, temperature=0, logprobs=True, top_logprobs=2,
    )
    lp = chat.choices[0].logprobs.content[0]
    gap = lp.top_logprobs[0].logprob - lp.top_logprobs[1].logprob
    assert abs(gap - got.ready_gap) < 1e-3, (gap, got.ready_gap)
    first = lp.token
    hit = client.sessions.generate(s.id, prompt="Answer now.", fast_answer=[first, "Maybe-not"],
                                   gap_threshold=got.ready_gap - 1e-3)
    assert hit.speculative is True and hit.text == first, hit
    assert hit.logit_gap == pytest.approx(got.ready_gap, abs=1e-4)
    assert hit.usage.prompt_tokens == 0 and hit.usage.completion_tokens == 0
    assert hit.data_version == got.data_version
    miss = client.sessions.generate(s.id, prompt="Answer now.", fast_answer=[first],
                                    gap_threshold=got.ready_gap + 1, max_tokens=2, temperature=0)
    assert miss.speculative is None and miss.usage.completion_tokens > 0, miss
    other = client.sessions.generate(s.id, prompt="Answer now.", fast_answer=["Maybe-not"],
                                     gap_threshold=0, max_tokens=2, temperature=0)
    assert other.speculative is None, "a candidate that does not start with the ready token"


# ── Errors ─────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def target_session(smol):
    """One session for the error tests (they must leave it untouched)."""
    r = raw(smol, "POST", "/v1/sessions", {"id": uid("errors")})
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    yield sid
    raw(smol, "DELETE", f"/v1/sessions/{sid}")


USER = [{"role": "user", "content": "hi"}]
BAD_REQUESTS = [
    ("create", {"id": "bad id!"}, "id"),
    ("create", {"id": "a/b"}, "id"),
    ("create", {"id": "x" * 129}, "id"),
    ("create", {"id": ""}, "id"),
    ("create", {"window": -5}, "window"),
    ("create", {"overflow": "sometimes"}, "overflow"),
    ("create", {"frobnicate": 1}, "frobnicate"),
    ("push", {"data": []}, "data"),
    ("push", {}, "data"),
    ("push", {"data": 5}, "data"),
    ("push", {"data": "x", "frobnicate": 1}, "frobnicate"),
    ("push", {"data": "x", "wait": "yes"}, "wait"),
    ("push", {"data": "x", "wait_timeout": 5}, "wait_timeout"),
    ("push", {"data": "x", "wait": True, "wait_timeout": 0}, "wait_timeout"),
    ("push", {"data": "x", "wait": True, "wait_timeout": 1e9}, "wait_timeout"),
    ("generate", {"prompt": "hi", "min_data_version": 5}, "min_data_version"),
    ("generate", {"prompt": ""}, "prompt"),
    ("generate", {}, "prompt"),
    ("generate", {"prompt": "hi", "messages": USER}, "messages"),
    ("generate", {"prompt": "hi", "frobnicate": 1}, "frobnicate"),
    ("flash", {}, "query"),
    ("flash", {"query": "q?", "frobnicate": 1}, "frobnicate"),
    ("warm", {"messages": USER, "frobnicate": 1}, "frobnicate"),
]


@pytest.mark.parametrize("route,body,name", BAD_REQUESTS,
                         ids=[f"{r}-{n}-{i}" for i, (r, _, n) in enumerate(BAD_REQUESTS)])
def test_bad_request_is_400_naming_the_field(smol, target_session, route, body, name):
    path = "/v1/sessions" if route == "create" else f"/v1/sessions/{target_session}/{route}"
    before = {s["id"] for s in raw(smol, "GET", "/v1/sessions").json()["data"]}
    check_error(raw(smol, "POST", path, body), 400, name)
    after = raw(smol, "GET", "/v1/sessions").json()["data"]
    assert {s["id"] for s in after} == before, "a refused create made a session"
    s = session_get(smol, target_session)
    assert s["total_pushed"] == 0 and s["turns"] == 0 and s["data_version"] == 0, s
    assert raw(smol, "GET", f"/v1/sessions/{target_session}/flash").json()["data"] == []


def test_client_maps_400(client, target_session):
    for call in (lambda: client.sessions.create(id="bad id!"),
                 lambda: client.sessions.create(id="y" * 129),
                 lambda: client.sessions.push(target_session, []),
                 lambda: client.sessions.generate(target_session, prompt="")):
        with pytest.raises(layerscale.BadRequestError) as e:
            call()
        assert e.value.status_code == 400 and e.value.type


NOT_FOUND = [("GET", ""), ("DELETE", ""), ("POST", "/push"), ("POST", "/generate"), ("POST", "/warm"),
             ("POST", "/flash"), ("GET", "/flash"), ("DELETE", "/flash/1"), ("GET", "/events"), ("GET", "/data")]
NOT_FOUND_BODY = {"/push": {"data": "x"}, "/generate": {"prompt": "hi"}, "/warm": {"messages": USER},
                  "/flash": {"query": "q?"}}


@pytest.mark.parametrize("method,tail", NOT_FOUND, ids=[f"{m}{t or '/'}" for m, t in NOT_FOUND])
def test_unknown_session_is_404(smol, method, tail):
    sid = "sess_missing_404"
    r = raw(smol, method, f"/v1/sessions/{sid}{tail}", NOT_FOUND_BODY.get(tail))
    check_error(r, 404, sid)


def test_unknown_flash_id_is_404(smol, target_session):
    check_error(raw(smol, "DELETE", f"/v1/sessions/{target_session}/flash/424242"), 404, "424242")
    check_error(raw(smol, "POST", f"/v1/sessions/{target_session}/generate", {"flash_id": 424242}), 404, "424242")


# ── Isolation, KV accounting, expiry ───────────────────────────────────────────────────────


def test_sessions_are_isolated_and_delete_frees_kv(client, smol, janitor):
    before = smol.wait_idle()["kv_pages_free"]
    a = create(client, smol, janitor)
    b = create(client, smol, janitor)
    client.sessions.push(a.id, WEATHER[:3], wait=True)
    client.sessions.push(b.id, LOG[:6], wait=True)
    sa, da = settle_session(smol, a.id)
    sb, db = settle_session(smol, b.id)
    assert da["entries"] == WEATHER[:3] and db["entries"] == LOG[:6]
    assert sa["data_end"] != sb["data_end"]
    for sid, entries in ((a.id, WEATHER[:3]), (b.id, LOG[:6])):
        g = client.sessions.generate(sid, prompt=Q_NOW, max_tokens=1, temperature=0)
        assert g.usage.prompt_tokens == stateless(client, None, entries, Q_NOW, 1).usage.prompt_tokens
    client.sessions.push(a.id, WEATHER[3:5], wait=True)
    sb2 = session_get(smol, b.id)
    assert (sb2["data_version"], sb2["data_end"]) == (sb["data_version"], sb["data_end"])
    assert session_data(smol, b.id)["entries"] == LOG[:6]

    held = smol.wait_idle()
    assert held["kv_pages_free"] < before, "a session with data holds no KV blocks"
    assert held["sessions"] >= 2
    assert client.sessions.delete(a.id).deleted and client.sessions.delete(b.id).deleted
    h = wait_kv_free(smol, before)
    assert h["kv_pages_free"] == before, f"blocks leaked by deleted sessions: {before} -> {h}"


@pytest.fixture(scope="module")
def ttl_server(tiny_qwen3_long_dir):
    server = start_server("tiny-qwen3-ttl", str(tiny_qwen3_long_dir), "--kv-memory", "16MiB", "--session-ttl", "2",
                          "--max-sessions", "4")
    yield server
    server.stop()


def listed(server) -> set[str]:
    """Ids of live sessions; listing does not touch the idle clock."""
    r = raw(server, "GET", "/v1/sessions")
    assert r.status_code == 200, r.text
    return {s["id"] for s in r.json()["data"]}


@pytest.mark.timeout(90)
def test_idle_expiry_frees_kv_but_not_while_streaming(ttl_server):
    server = ttl_server
    before = server.wait_idle()["kv_pages_free"]
    c = layerscale.LayerScale(base_url=server.url, api_key="", max_retries=0, timeout=60)
    idle = c.sessions.create()
    watched = c.sessions.create()
    c.sessions.push(idle.id, ["t1", "t2", "t3"], wait=True)
    touched = time.monotonic()
    assert server.health()["kv_pages_free"] < before
    with httpx.Client(timeout=httpx.Timeout(10, read=30)) as hc:
        with hc.stream("GET", session_url(server, watched.id, "/events")) as stream:
            assert stream.status_code == 200
            time.sleep(0.5)
            assert {idle.id, watched.id} <= listed(server), "expired before its time-to-live"
            deadline = touched + 15
            while idle.id in listed(server) and time.monotonic() < deadline:
                time.sleep(0.1)
            gone_after = time.monotonic() - touched
            assert idle.id not in listed(server), "an idle session did not expire"
            assert gone_after >= 1.0, gone_after
            while time.monotonic() < touched + 5:
                time.sleep(0.2)
            assert watched.id in listed(server), "a session with an open event stream expired"
    deadline = time.monotonic() + 15
    while watched.id in listed(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watched.id not in listed(server), "the session did not expire after its stream closed"
    with pytest.raises(layerscale.NotFoundError):
        c.sessions.get(idle.id)
    h = wait_kv_free(server, before)
    assert h["kv_pages_free"] == before, f"expiry leaked KV blocks: {before} -> {h}"
    assert h["sessions"] == 0
    c.close()


# ── Auth ───────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def keyed_session(keyed):
    auth = {"authorization": f"Bearer {API_KEY}"}
    r = raw(keyed, "POST", "/v1/sessions", {}, headers=auth)
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    yield sid
    raw(keyed, "DELETE", f"/v1/sessions/{sid}", headers=auth)


AUTH_ROUTES = [("GET", "/v1/sessions", None), ("POST", "/v1/sessions", {}), ("GET", "{s}", None),
               ("DELETE", "{s}", None), ("POST", "{s}/push", {"data": "x"}),
               ("POST", "{s}/generate", {"prompt": "hi", "max_tokens": 1}), ("POST", "{s}/warm", {"messages": USER}),
               ("POST", "{s}/flash", {"query": "q?"}), ("GET", "{s}/flash", None), ("DELETE", "{s}/flash/0", None),
               ("GET", "{s}/events", None), ("GET", "{s}/data", None)]


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}],
                         ids=["none", "wrong-bearer", "wrong-x-api-key"])
@pytest.mark.parametrize("method,path,body", AUTH_ROUTES, ids=[f"{m} {p}" for m, p, _ in AUTH_ROUTES])
def test_session_routes_need_the_key(keyed, keyed_session, method, path, body, headers):
    url = path.replace("{s}", f"/v1/sessions/{keyed_session}")
    err = check_error(raw(keyed, method, url, body, headers=headers, timeout=10), 401)
    assert err["type"] == "authentication_error", err
    assert keyed_session in listed_with_key(keyed)


def listed_with_key(server) -> set[str]:
    r = raw(server, "GET", "/v1/sessions", headers={"x-api-key": API_KEY})
    assert r.status_code == 200, r.text
    return {s["id"] for s in r.json()["data"]}


def test_session_routes_accept_the_key(keyed):
    # The keyed server runs the 128-token tiny Qwen3: no pushes here, they could not leave room
    # for a question.
    with layerscale.LayerScale(base_url=keyed.url, api_key="", max_retries=0) as anonymous:
        with pytest.raises(layerscale.AuthenticationError):
            anonymous.sessions.list()
    with layerscale.LayerScale(base_url=keyed.url, api_key=API_KEY, max_retries=0, timeout=60) as c:
        s = c.sessions.create()
        assert s.id in [x.id for x in c.sessions.list().data]
        assert c.sessions.get(s.id).id == s.id
        g = c.sessions.generate(s.id, prompt="hi", max_tokens=2, temperature=0, ignore_eos=True)
        assert g.usage.completion_tokens == 2
        f = c.sessions.flash(s.id, "q?", max_tokens=1)
        assert c.sessions.unflash(s.id, f.id).remaining == 0
        assert c.sessions.delete(s.id).deleted is True


# ── Async client ───────────────────────────────────────────────────────────────────────────


def test_async_client_every_method(qwen):
    async def main() -> None:
        async with layerscale.AsyncLayerScale(base_url=qwen.url, api_key="", max_retries=0, timeout=60) as c:
            sid = uid("async")
            s = await c.sessions.create(id=sid, window=400)
            gen = await c.sessions.create(pre_decode=True)
            try:
                assert s.id == sid and s.window == 400 and s.data_version == 0
                assert gen.id.startswith("sess_") and gen.pre_decode is True
                ids = [x.id for x in (await c.sessions.list()).data]
                assert ids.index(sid) < ids.index(gen.id)
                assert (await c.sessions.get(sid)).created == s.created

                f = await c.sessions.flash(sid, "Next?", max_tokens=3)
                assert f.max_tokens == 3
                a1 = await c.sessions.push(sid, "a1")
                assert a1.pushed == 1 and a1.total_pushed == 1
                a2 = await c.sessions.push(sid, ["a2", "a3"], wait=True)
                assert a2.pushed == 2 and a2.total_pushed == 3 and a2.dropped == 0
                after = await c.sessions.get(sid)
                assert after.pending == 0 and after.data_version > a2.data_version
                assert session_data(qwen, sid)["entries"] == ["a1", "a2", "a3"]
                fl = await c.sessions.list_flash(sid)
                assert fl.data_version == after.data_version and fl.data[0].id == f.id

                body = dict(prompt="Summary?", max_tokens=4, temperature=0, ignore_eos=True)
                g = await c.sessions.generate(sid, **body)
                assert g.session_id == sid and g.usage.completion_tokens == 4 and g.finish_reason == "length"
                assert g.data_version == after.data_version
                assert g.usage.prompt_tokens_details.cached_tokens > 0
                chunks = [ch async for ch in await c.sessions.generate_stream(sid, **body)]
                assert isinstance(chunks[-1], GenerationDone)
                assert all(isinstance(ch, GenerationTextChunk) for ch in chunks[:-1])
                assert "".join(ch.text for ch in chunks[:-1]) == g.text
                assert chunks[-1].usage.completion_tokens == 4

                msgs = [{"role": "user", "content": "Hello there."}]
                w = await c.sessions.warm(gen.id, messages=msgs)
                assert w.finish_reason == "warmed" and w.prompt_tokens > 0
                w2 = await c.sessions.warm(gen.id, messages=msgs)
                assert w2.finish_reason == "covered" and w2.cached_tokens == w2.prompt_tokens == w.prompt_tokens

                un = await c.sessions.unflash(sid, f.id)
                assert un.deleted is True and un.remaining == 0
                with pytest.raises(layerscale.ConflictError):
                    await c.sessions.create(id=sid)
                d = await c.sessions.delete(gen.id)
                assert d.deleted is True and d.id == gen.id
                with pytest.raises(layerscale.NotFoundError):
                    await c.sessions.get(gen.id)
                with pytest.raises(layerscale.BadRequestError):
                    await c.sessions.push(sid, [])
            finally:
                for x in (sid, gen.id):
                    try:
                        await c.sessions.delete(x)
                    except layerscale.NotFoundError:
                        pass

    asyncio.run(main())


# ── Metrics ────────────────────────────────────────────────────────────────────────────────


SESSION_METRICS = ("vigil_flash_hits_total", "vigil_flash_misses_total", "vigil_flash_evaluations_total",
                   "vigil_flash_skipped_total", "vigil_flash_lag_versions_total", "vigil_sessions_live",
                   "vigil_session_ingested_entries_total", "vigil_session_dropped_entries_total")


def test_session_metrics_and_health(qwen, qclient, janitor):
    m0, h0 = qwen.metrics_text(), qwen.health()
    s = create(qclient, qwen, janitor)
    qclient.sessions.flash(s.id, "Count?", max_tokens=2)
    qclient.sessions.push(s.id, ["m1", "m2", "m3"], wait=True)
    wait_flash_fresh(qwen, s.id)
    assert qclient.sessions.generate(s.id, prompt="Count?").flash is True
    m1, h1 = qwen.metrics_text(), qwen.health()
    names = {n for n, _, _ in prom_samples(m1)}
    missing = [n for n in SESSION_METRICS if n not in names]
    assert not missing, missing

    def delta(name: str) -> float:
        return prom_value(m1, name) - prom_value(m0, name)

    assert delta("vigil_flash_hits_total") == 1
    assert delta("vigil_flash_evaluations_total") >= 1
    assert delta("vigil_session_ingested_entries_total") == 3
    assert delta("vigil_session_dropped_entries_total") == 0
    live = len(qclient.sessions.list().data)
    assert prom_value(m1, "vigil_sessions_live") == live == h1["sessions"]
    assert h1["session_flash_hits"] - h0["session_flash_hits"] == 1
    assert h1["session_ingested_tokens"] > h0["session_ingested_tokens"]


def test_flash_answers_each_version_before_the_next_batch_lands(qwen, qclient, janitor):
    """Entries pushed back to back while a batch is ingested or a flash evaluation runs wait
    and land together as the next batch: each version is answered before the next one lands
    (evaluations, not skips), and the answer is current at the end."""
    s = create(qclient, qwen, janitor)
    f = qclient.sessions.flash(s.id, "Summarise everything so far.", max_tokens=32)
    m0 = qwen.metrics_text()
    # Pushed from 12 threads at once, so most arrive while the first batch is ingested and its
    # flash evaluation runs: one push after another raced the tiny model's 32-token evaluation
    # and, on a quiet host, sometimes lost every time (each push its own batch).
    start = threading.Barrier(12)

    def push(i: int) -> None:
        start.wait(timeout=30)
        qclient.sessions.push(s.id, [f"batch {i} value {i * 7}"])

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(push, range(12)))
    settled, data = settle_session(qwen, s.id)
    version = settled["data_version"]
    assert len(data["entries"]) == 12 and settled["total_pushed"] == 12
    assert version < 12, "nothing coalesced: every push landed as its own batch"
    q = next(x for x in wait_flash_fresh(qwen, s.id)["data"] if x["id"] == f.id)
    assert q["data_version"] == version
    assert q["evaluations"] + q["skipped"] == version, q
    # A version is skipped only when its evaluation took longer than the ingest worker waits
    # for it (2 s): not with 32 tokens on the tiny model.
    assert q["skipped"] == 0, q
    m1 = qwen.metrics_text()
    assert prom_value(m1, "vigil_flash_skipped_total") == prom_value(m0, "vigil_flash_skipped_total")


def test_turn_cancels_a_running_warm_and_keeps_its_work(client, smol, janitor):
    """A warm turn is background work: the session's next turn cancels it at a step boundary
    (`cancelled`), the KV it computed is kept, and the turn itself succeeds."""
    s = create(client, smol, janitor)
    # Long enough (about 3,400 tokens) that the warm still runs seconds after it is seen running
    # on the fastest CPU here; the nonce keeps any cached prefix of an earlier run out of it.
    nonce = uuid.uuid4().hex
    long_text = nonce + " " + " ".join(
        f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(240))
    convo = [{"role": "user", "content": long_text}]
    result = {}

    def warm():
        result["warm"] = raw(smol, "POST", f"/v1/sessions/{s.id}/warm", {"messages": convo}, timeout=120)

    def running() -> float:
        return sum(v for n, _, v in prom_samples(smol.metrics_text()) if n == "vllm:num_requests_running")

    t = threading.Thread(target=warm)
    t.start()
    # The turn must arrive while the warm computes: wait until the engine runs it, not a fixed
    # sleep (a fixed second let a short warm finish first on a fast CPU).
    deadline = time.monotonic() + 60
    while running() < 1:
        assert time.monotonic() < deadline, "the warm never started running"
        assert t.is_alive(), f"the warm ended before it was seen running: {result}"
        time.sleep(0.02)
    chat = raw(smol, "POST", "/v1/chat/completions",
               {"messages": convo, "max_tokens": 2, "temperature": 0},
               headers={"x-layerscale-session-id": s.id}, timeout=120)
    t.join(timeout=120)
    assert chat.status_code == 200, chat.text
    w = result["warm"]
    assert w.status_code == 200, w.text
    assert w.json()["finish_reason"] == "cancelled", w.json()
    cached = chat.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0, "the warm turn's work was not kept"
    assert client.sessions.get(s.id).turns == 1


def test_live_session_cap_is_409(ttl_server):
    """`--max-sessions 4`: the fifth live session is refused with 409 naming the cap; deleting
    one makes room."""
    c = layerscale.LayerScale(base_url=ttl_server.url, api_key="", max_retries=0, timeout=60)
    made = [c.sessions.create().id for _ in range(4 - len(listed(ttl_server)))]
    try:
        with pytest.raises(layerscale.ConflictError) as e:
            c.sessions.create()
        assert "--max-sessions" in str(e.value), e.value
        c.sessions.delete(made.pop())
        made.append(c.sessions.create().id)
    finally:
        for sid in made:
            try:
                c.sessions.delete(sid)
            except layerscale.NotFoundError:
                pass  # expired meanwhile (TTL 2 s)
        c.close()


def test_append_only_session_that_fills_refuses_the_push(qclient, qwen, janitor):
    """Without a window a session grows until it would leave no room for a question: that
    push is refused with 400 `context_length_exceeded` naming `data`, nothing of it is queued,
    and the session still answers."""
    s = create(qclient, qwen, janitor)
    line = "reading " + "x" * 40
    refused = None
    for i in range(200):
        r = raw(qwen, "POST", f"/v1/sessions/{s.id}/push", {"data": [f"{i} {line}"] * 4})
        if r.status_code != 200:
            refused = r
            break
    assert refused is not None, "a 1024-token session took 800 entries"
    err = check_error(refused, 400, ("data",))
    assert err["code"] == "context_length_exceeded", err
    settled, data = settle_session(qwen, s.id)
    assert settled["total_dropped"] == 0 and len(data["entries"]) == 4 * i, (i, settled)
    g = qclient.sessions.generate(s.id, prompt="Last?", max_tokens=3, temperature=0)
    assert g.usage.completion_tokens >= 1


def test_window_evicts_to_half_by_default_whatever_the_batching(qclient, qwen, janitor):
    """The default amortizes recompute (evict_to = window // 2), and the rule is applied entry
    by entry: the same entries pushed one by one or in one batch leave the same window."""
    entries = [f"Reading {i}: level {40 + i} percent" for i in range(30)]
    one = create(qclient, qwen, janitor, window=60)
    assert one.model_extra["evict_to"] == 30
    batched = create(qclient, qwen, janitor, window=60)
    for e in entries:
        qclient.sessions.push(one.id, e, wait=True)
    qclient.sessions.push(batched.id, entries, wait=True)
    a, ad = settle_session(qwen, one.id)
    b, bd = settle_session(qwen, batched.id)
    assert ad["entries"] == bd["entries"] and ad["evicted"] == bd["evicted"] > 0, (ad, bd)
    assert ad["entries"] == entries[ad["evicted"]:]
    assert a["data_end"] == b["data_end"]
    # One recompute per several evicted entries, not one per push.
    assert a["window_recomputes"] < a["evicted"], a


def test_window_evict_to_evicts_further_when_it_evicts(qclient, qwen, janitor):
    s = create(qclient, qwen, janitor, window=200, evict_to=100)
    assert s.model_extra["evict_to"] == 100
    for i in range(30):
        qclient.sessions.push(s.id, [f"entry {i} " + "y" * 20], wait=True)
    st, data = settle_session(qwen, s.id)
    opening = st["prompt_tokens"]
    assert st["evicted"] > 0 and data["entries"] == [f"entry {i} " + "y" * 20 for i in range(st["evicted"], 30)]
    assert st["data_end"] - opening <= 200
    # Each recompute evicted down to 100 tokens, so there were fewer recomputes than evictions.
    assert st["window_recomputes"] < st["evicted"], st
    r = raw(qwen, "POST", "/v1/sessions", {"window": 50, "evict_to": 60})
    check_error(r, 400, ("evict_to",))


def test_window_mode_shift_keeps_the_window_without_recompute(qclient, qwen, janitor):
    """`window_mode: "shift"` (approximate, Vigil): the same entries are retained as in exact
    mode, evictions are done by shifting the kept KV instead of recomputing it, and the session
    still answers; the mode is refused without a window or with an unknown name."""
    entries = [f"Reading {i}: level {40 + i} percent" for i in range(30)]
    shift = create(qclient, qwen, janitor, window=60, window_mode="shift")
    exact = create(qclient, qwen, janitor, window=60)
    for e in entries:
        qclient.sessions.push(shift.id, e, wait=True)
        qclient.sessions.push(exact.id, e, wait=True)
    a, ad = settle_session(qwen, shift.id)
    b, bd = settle_session(qwen, exact.id)
    assert ad["entries"] == bd["entries"] and a["evicted"] == b["evicted"] > 0, (a, b)
    assert a["window_mode"] == "shift" and b["window_mode"] == "exact"
    assert a["window_shifts"] > 0 and a["window_recomputes"] == 0, a
    assert b["window_recomputes"] > 0 and b["window_shifts"] == 0, b
    assert a["kv_tokens"] == a["data_end"], a
    g = qclient.sessions.generate(shift.id, prompt="Last level?", max_tokens=4, temperature=0)
    assert g.usage.completion_tokens >= 1
    check_error(raw(qwen, "POST", "/v1/sessions", {"window_mode": "shift"}), 400, ("window_mode",))
    check_error(raw(qwen, "POST", "/v1/sessions", {"window": 60, "window_mode": "rotate"}), 400)


def test_session_generate_over_capacity_is_503(overload):
    """A session generate is a foreground request like any other: past `--max-seqs` +
    `--max-queue` it is refused with 503 (the client's InternalServerError); data pushed
    meanwhile lands once the seat is free."""
    overload.wait_idle()
    c = layerscale.LayerScale(base_url=overload.url, api_key="", max_retries=0, timeout=120)
    s = c.sessions.create()
    try:
        c.sessions.push(s.id, ["a line of data"], wait=True)
        body = {"prompt": "Tell a long story.", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=120) as holder:
            with holder.stream("POST", session_url(overload, s.id, "/generate"), json=body) as held:
                assert held.status_code == 200
                lines = held.iter_lines()  # kept: a dropped iterator closes the stream
                next(lines)
                with pytest.raises(layerscale.InternalServerError) as e:
                    c.sessions.generate(s.id, prompt="Quick?", max_tokens=2)
                assert e.value.status_code == 503
                ack = c.sessions.push(s.id, ["more data"])
        deadline = time.monotonic() + 60
        while c.sessions.get(s.id).data_version <= ack.data_version:
            assert time.monotonic() < deadline, "pushed data never landed"
            time.sleep(0.1)
        delete_when_free(c, s.id)
    finally:
        c.close()
