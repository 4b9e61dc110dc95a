"""Shared fixtures for the HTTP API tests: start `vigil serve` on free ports, wait for it to be
ready, and attach each server's stderr to the report of any test that fails while using it.

Environment:
  VIGIL_BIN        path to the `vigil` binary (required; the suite fails at once without it)
  VIGIL_TEST_GGUF  SmolLM2-135M-Instruct Q4_1 (default: <repo>/.cache/SmolLM2-135M-Instruct.Q4_1.gguf)
  VIGIL_TEST_THREADS  kernel threads per server (default 2)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
KV_BLOCK_TOKENS = 16
READY_TIMEOUT_S = 180.0

# Every server started in this run, in start order, so a failing test can show the logs of
# the servers it talked to.
_SERVERS: list["VigilServer"] = []


def vigil_bin() -> str:
    """The binary under test; stops the whole run (not just one test) when it is missing."""
    path = os.environ.get("VIGIL_BIN")
    if not path:
        pytest.exit(
            "VIGIL_BIN is not set: point it at the vigil binary, e.g. "
            "VIGIL_BIN=target/debug/vigil (see tests/api/README.md)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    if not os.access(path, os.X_OK):
        pytest.exit(f"VIGIL_BIN={path} is not an executable file", returncode=pytest.ExitCode.USAGE_ERROR)
    return path


def smollm_gguf() -> str:
    path = os.environ.get("VIGIL_TEST_GGUF") or str(REPO / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not Path(path).is_file():
        pytest.fail(
            f"SmolLM2 GGUF not found at {path}: run scripts/fetch_test_assets.sh and export VIGIL_TEST_GGUF",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VigilServer:
    """One `vigil serve` process. stdout and stderr go to a temp file (`log_path`)."""

    def __init__(self, name: str, model: str, args: list[str]) -> None:
        self.name = name
        self.model = model
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, log = tempfile.mkstemp(prefix=f"vigil-{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log)
        self.proc: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.state_dir: Optional[Path] = None

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        threads = os.environ.get("VIGIL_TEST_THREADS", "2")
        # Each server journals its sessions in a directory of its own (never $VIGIL_HOME's),
        # unless the test chose one (or none).
        state = []
        if not any(a in ("--state-dir", "--no-persist") for a in self.args):
            if self.state_dir is None:
                self.state_dir = Path(tempfile.mkdtemp(prefix=f"vigil-state-{self.name}-"))
            state = ["--state-dir", str(self.state_dir)]
        return [
            vigil_bin(), "serve", "--model", self.model, "--host", "127.0.0.1",
            "--port", str(self.port), "--threads", threads, *state, *self.args,
        ]

    def start(self) -> "VigilServer":
        env = {k: v for k, v in os.environ.items() if k not in ("VIGIL_API_KEY",)}
        env.setdefault("RUST_BACKTRACE", "1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        _SERVERS.append(self)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> "VigilServer":
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"vigil serve ({self.name}) exited with {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    return self
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.05)
        raise RuntimeError(f"vigil serve ({self.name}) not ready after {timeout}s (last: {last}):\n" + self.log_tail())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait(timeout=timeout)
        return self.returncode

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, limit: int = 6000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(cannot read {self.log_path}: {e})"
        return text[-limit:]

    # Small conveniences used across modules.
    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def metrics_text(self, headers: Optional[dict] = None) -> str:
        r = httpx.get(self.url + "/metrics", timeout=10, headers=headers)
        r.raise_for_status()
        return r.text

    def model_info(self, headers: Optional[dict] = None) -> dict:
        r = httpx.get(self.v1 + "/models", timeout=10, headers=headers)
        r.raise_for_status()
        return r.json()["data"][0]

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Waits until nothing runs or waits; returns the last /health body."""
        deadline = time.monotonic() + timeout
        h = self.health()
        while time.monotonic() < deadline:
            h = self.health()
            if h.get("running") == 0 and h.get("queued") == 0:
                return h
            time.sleep(0.05)
        return h

    def __repr__(self) -> str:
        return f"VigilServer({self.name}, {self.url})"


def start_server(name: str, model: str, *args: str, wait: bool = True) -> VigilServer:
    server = VigilServer(name, model, list(args)).start()
    if wait:
        try:
            server.wait_ready()
        except Exception:
            server.stop()
            raise
    return server


@pytest.fixture(scope="session")
def gguf() -> str:
    vigil_bin()
    return smollm_gguf()


@pytest.fixture(scope="session")
def smol(gguf) -> Iterator[VigilServer]:
    """SmolLM2 with near-default settings, shared by every module (tests run one at a time)."""
    server = start_server("smollm2", gguf, "--kv-memory", "256MiB", "--max-body-bytes", "1048576")
    yield server
    server.stop()


def tiny_qwen3_with_context(dst: Path, context: int) -> Path:
    """The tiny Qwen3 checkpoint in `dst` (weights linked) with a `context`-token context: the
    weights are random and RoPE is computed, so a longer context is as valid."""
    src = TINY / "qwen3"
    for f in src.iterdir():
        if f.name == "model.safetensors":
            os.symlink(f, dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["max_position_embeddings"] = context
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    tok_cfg_path = dst / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["model_max_length"] = context
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=1))
    return dst


@pytest.fixture(scope="session")
def tiny_qwen3_long_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3 checkpoint with max_position_embeddings raised from 128 to 1024: the
    Qwen3 tool preamble alone renders to ~320 tokens, more than the fixture's 128."""
    return tiny_qwen3_with_context(tmp_path_factory.mktemp("tiny-qwen3-long"), 1024)


@pytest.fixture(scope="session")
def qwen(tiny_qwen3_long_dir) -> Iterator[VigilServer]:
    """Tiny random Qwen3 (1024-token context): tools, thinking template, fast."""
    server = start_server("tiny-qwen3", str(tiny_qwen3_long_dir), "--kv-memory", "64MiB")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def qwen128() -> Iterator[VigilServer]:
    """The tiny Qwen3 fixture as it is (max_model_len 128): cheap context-limit checks."""
    server = start_server("tiny-qwen3-128", str(TINY / "qwen3"), "--kv-memory", "16MiB")
    yield server
    server.stop()


API_KEY = "sk-vigil-test-key"

# serde's and Rust's words that a client-facing error must not contain: type errors are told in
# JSON's terms (an object, an array, a number, an integer from 0 to 4294967295).
RUST_WORDS = re.compile(
    r"tagged enum|untagged|variant identifier|field identifier|struct |sequence|floating point"
    r"|\bmap\b|\b[ui](8|16|32|64|size)\b|\bf(32|64)\b"
)


@pytest.fixture(scope="session")
def keyed() -> Iterator[VigilServer]:
    """A server started with --api-key (tiny model: only auth is under test)."""
    server = start_server("keyed", str(TINY / "qwen3"), "--kv-memory", "16MiB", "--api-key", API_KEY)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def overload(gguf) -> Iterator[VigilServer]:
    """SmolLM2 admitting one request at a time and queueing none: the second is a 503."""
    server = start_server("overload", gguf, "--kv-memory", "64MiB", "--max-seqs", "1", "--max-queue", "0")
    yield server
    server.stop()


# ── Reporting: attach the server logs to failing tests ─────────────────────────────────────


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._vigil_servers_before = len(_SERVERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    used = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, VigilServer)]
    used += _SERVERS[getattr(item, "_vigil_servers_before", len(_SERVERS)):]
    seen = set()
    for server in used:
        if id(server) in seen:
            continue
        seen.add(id(server))
        rep.sections.append((f"vigil serve log: {server.name} ({server.log_path})", server.log_tail()))


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(180))


def pytest_sessionfinish(session, exitstatus):
    for server in _SERVERS:
        server.stop()


# ── SSE over raw httpx ─────────────────────────────────────────────────────────────────────


def sse_frames(response: httpx.Response) -> Iterator[tuple[Optional[str], Optional[str], str]]:
    """Yields (id, event, data) per SSE frame; `id` is the frame's own `id:` line or None.
    Splits lines only on \\n, \\r\\n and \\r (JSON may hold raw U+2028), as the SSE spec and
    the reference client do."""
    buf = b""
    eid: Optional[str] = None
    event: Optional[str] = None
    data: list[str] = []
    for chunk in response.iter_bytes():
        buf += chunk
        while True:
            idx = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
            if not idx:
                break
            i = min(idx)
            line = buf[:i].decode("utf-8")
            buf = buf[i + 2:] if buf[i:i + 2] == b"\r\n" else buf[i + 1:]
            if line == "":
                if data:
                    yield eid, event, "\n".join(data)
                eid, event, data = None, None, []
            elif line.startswith(":"):
                continue
            elif line.startswith("id:"):
                eid = line[3:].strip()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
    if data:
        yield eid, event, "\n".join(data)


def iter_sse(response: httpx.Response) -> Iterator[tuple[Optional[str], str]]:
    """Yields (event, data) frames (see `sse_frames`)."""
    for _, event, data in sse_frames(response):
        yield event, data


def prom_samples(text: str) -> list[tuple[str, dict, float]]:
    """Parses Prometheus text exposition into (name, labels, value); raises on a bad line."""
    import re

    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)(\s+\d+)?$')
    label = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = sample.match(line)
        if not m:
            raise AssertionError(f"not a Prometheus sample line: {line!r}")
        labels = {}
        if m.group(3):
            rest = m.group(3)
            pos = 0
            while pos < len(rest):
                lm = label.match(rest, pos)
                if not lm:
                    raise AssertionError(f"bad labels in {line!r}")
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def prom_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0.0 if none)."""
    return sum(v for n, ls, v in prom_samples(text) if n == name and all(ls.get(k) == x for k, x in labels.items()))


# ── Sessions (test_sessions.py, test_sessions_events.py) ───────────────────────────────────


def proc_status_mib(pid: int, field: str) -> float:
    """A memory field of /proc/PID/status (`VmRSS`, `VmHWM`, ...) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def session_url(server: VigilServer, sid: str, tail: str = "") -> str:
    return f"{server.v1}/sessions/{sid}{tail}"


def session_get(server: VigilServer, sid: str, headers: Optional[dict] = None) -> dict:
    """The raw session object (Vigil's extra fields included); asserts 200."""
    r = httpx.get(session_url(server, sid), headers=headers, timeout=30)
    assert r.status_code == 200, f"GET session {sid}: {r.status_code} {r.text[:300]}"
    return r.json()


def session_data(server: VigilServer, sid: str, headers: Optional[dict] = None) -> dict:
    """Vigil extension `GET /v1/sessions/{id}/data`: `{"entries": [str], "evicted": int}`, the
    retained ingested entries in order (what a generate sees), and how many the window evicted."""
    r = httpx.get(session_url(server, sid, "/data"), headers=headers, timeout=30)
    assert r.status_code == 200, f"GET data {sid}: {r.status_code} {r.text[:300]}"
    body = r.json()
    assert isinstance(body.get("entries"), list) and all(isinstance(e, str) for e in body["entries"]), body
    assert isinstance(body.get("evicted"), int), body
    return {"entries": body["entries"], "evicted": body["evicted"]}


def settle_session(server: VigilServer, sid: str, timeout: float = 60.0,
                   headers: Optional[dict] = None) -> tuple[dict, dict]:
    """Waits until every accepted entry of the session is ingested and KV-resident: nothing
    pending, retained + evicted entries equal pushed minus dropped (and the server's own count of
    ingested entries, `total_ingested`), and the residency predicate of the reference client
    (`kv_tokens + 1 >= data_end`). Returns (session, data)."""
    deadline = time.monotonic() + timeout
    while True:
        s = session_get(server, sid, headers)
        d = session_data(server, sid, headers)
        ingested = len(d["entries"]) + d["evicted"]
        if (s["pending"] == 0 and ingested == s["total_pushed"] - s["total_dropped"]
                and s["total_ingested"] == ingested and s["kv_tokens"] + 1 >= s["data_end"]):
            return s, d
        if time.monotonic() > deadline:
            raise AssertionError(f"session {sid} did not settle in {timeout}s: {s} / {len(d['entries'])} entries")
        time.sleep(0.05)


class SessionJanitor:
    """Deletes at teardown every session a test made, so none outlives its test (a live session
    holds KV blocks, which other tests count). A session still busy is retried for a while."""

    def __init__(self) -> None:
        self.made: list[tuple[VigilServer, str, Optional[dict]]] = []

    def track(self, server: VigilServer, sid: str, headers: Optional[dict] = None) -> str:
        self.made.append((server, sid, headers))
        return sid

    def create(self, server: VigilServer, headers: Optional[dict] = None, **body) -> dict:
        """`POST /v1/sessions` over raw HTTP (for Vigil's create fields); asserts 200."""
        r = httpx.post(server.v1 + "/sessions", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, f"create {body}: {r.status_code} {r.text[:300]}"
        s = r.json()
        self.track(server, s["id"], headers)
        return s

    def cleanup(self) -> None:
        for server, sid, headers in self.made:
            if not server.alive():
                continue
            deadline = time.monotonic() + 15
            while True:
                try:
                    r = httpx.delete(session_url(server, sid), headers=headers, timeout=30)
                except httpx.HTTPError:
                    break
                if r.status_code != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)


@pytest.fixture
def janitor() -> Iterator[SessionJanitor]:
    j = SessionJanitor()
    yield j
    j.cleanup()


def wait_flash_fresh(server: VigilServer, sid: str, timeout: float = 60.0) -> dict:
    """Polls `GET /v1/sessions/{id}/flash` until every query is fresh; returns the raw list."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(session_url(server, sid, "/flash"), timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        if body["data"] and all(q["fresh"] for q in body["data"]):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"flash queries of {sid} not fresh after {timeout}s: {body}")
        time.sleep(0.05)
