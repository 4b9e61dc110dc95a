"""Scale-out on existing parts: three `vigil serve` replicas behind Debian's nginx, configured
by `deploy/nginx.conf` as shipped (only its `server` addresses and listen port rewritten to
loopback). Sessions created through the router live on exactly one replica and every call on
them lands there; requests without a session are spread; a replica killed with -9 and restarted
serves its sessions again behind the router; export/import moves a session to another replica
with its answers unchanged.

nginx comes from `scripts/setup_nginx.sh` (apt). Without it this module is skipped, except
under CI (CI=true), where it fails."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO, TINY, free_port, settle_session, start_server

NGINX = os.environ.get("VIGIL_TEST_NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"

if not Path(NGINX).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"nginx not found at {NGINX}: scripts/setup_nginx.sh installs it, CI needs it")
    pytest.skip("nginx is not installed (scripts/setup_nginx.sh installs it)", allow_module_level=True)

REPLICAS = 3


def router_conf(replica_ports: list[int], port: int, work: Path) -> str:
    """deploy/nginx.conf with loopback addresses, and its files under `work`."""
    conf = (REPO / "deploy" / "nginx.conf").read_text()
    n = 0

    def to_loopback(m: re.Match) -> str:
        return f"server 127.0.0.1:{replica_ports[int(m.group(1))]}"

    conf, n = re.subn(r"server vigil-(\d)\.vigil:8080", to_loopback, conf)
    assert n == 2 * REPLICAS, f"deploy/nginx.conf lists {n // 2} replicas per upstream, the test starts {REPLICAS}"
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    head = f"user root;\ndaemon off;\npid {work}/nginx.pid;\nerror_log {work}/error.log info;\n"
    temps = "".join(f"    {k}_temp_path {work}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = conf.replace("http {\n", f"http {{\n    access_log {work}/access.log;\n{temps}", 1)
    return head + conf


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("router")
    replicas = [
        start_server(f"replica-{i}", str(TINY / "qwen3"), "--kv-memory", "16MiB", "--state-dir", str(work / f"state-{i}"))
        for i in range(REPLICAS)
    ]
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(router_conf([r.port for r in replicas], port, work))
    check = subprocess.run([NGINX, "-t", "-c", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    nginx = subprocess.Popen([NGINX, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert nginx.poll() is None and time.monotonic() < deadline, (work / "error.log").read_text()
        time.sleep(0.05)
    yield url + "/v1", replicas
    nginx.send_signal(signal.SIGQUIT)
    try:
        nginx.wait(10)
    except subprocess.TimeoutExpired:
        nginx.kill()
    for r in replicas:
        r.stop()


def holders(replicas, sid: str) -> list[int]:
    """The replicas that hold session `sid`."""
    return [i for i, r in enumerate(replicas)
            if httpx.get(f"{r.v1}/sessions/{sid}", timeout=10).status_code == 200]


def test_sessions_live_on_one_replica_and_every_call_lands_there(cluster):
    router, replicas = cluster
    made = []
    for k in range(12):
        r = httpx.post(router + "/sessions", json={}, timeout=30)
        assert r.status_code == 200, r.text
        made.append(r.json()["id"])
    placed = {sid: holders(replicas, sid) for sid in made}
    assert all(len(h) == 1 for h in placed.values()), placed
    assert len({h[0] for h in placed.values()}) >= 2, f"12 sessions all on one replica: {placed}"
    for sid in made:
        home = placed[sid][0]
        for body in ({"data": [f"{sid} first"]}, {"data": f"{sid} second", "wait": True}):
            r = httpx.post(f"{router}/sessions/{sid}/push", json=body, timeout=30)
            assert r.status_code == 200, r.text
            assert r.headers["x-vigil-upstream"] == f"127.0.0.1:{replicas[home].port}"
        r = httpx.post(f"{router}/sessions/{sid}/flash", json={"query": "What came first?"}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.get(f"{router}/sessions/{sid}/data", timeout=30)
        assert r.status_code == 200 and r.json()["entries"] == [f"{sid} first", f"{sid} second"], r.text
        # A turn naming the session in the header lands on its replica too.
        r = httpx.post(router + "/chat/completions", headers={"x-layerscale-session-id": sid}, timeout=60,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.headers["x-vigil-upstream"] == f"127.0.0.1:{replicas[home].port}"
    # A client-chosen id travels in the header; in the body alone it would be routed blind.
    r = httpx.post(router + "/sessions", json={"id": "chosen-1"}, headers={"x-layerscale-session-id": "chosen-1"}, timeout=30)
    assert r.status_code == 200, r.text
    assert len(holders(replicas, "chosen-1")) == 1
    r = httpx.post(router + "/sessions", json={"id": "chosen-2"}, timeout=30)
    assert r.status_code == 400 and "header" in r.json()["error"]["message"], r.text


def test_requests_without_a_session_are_spread(cluster):
    router, replicas = cluster
    seen = set()
    with httpx.Client(timeout=60) as c:
        for _ in range(12):
            r = c.post(router + "/completions", json={"model": "m", "prompt": "Once", "max_tokens": 2})
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-vigil-upstream"])
    assert len(seen) == REPLICAS, seen


def test_a_replica_killed_and_restarted_serves_its_sessions_again(cluster):
    router, replicas = cluster
    sids = []
    for k in range(6):
        r = httpx.post(router + "/sessions", json={}, timeout=30)
        sids.append(r.json()["id"])
        r = httpx.post(f"{router}/sessions/{sids[-1]}/push", json={"data": [f"kept {k}", f"also {k}"], "wait": True},
                       timeout=30)
        assert r.status_code == 200, r.text
    victim = holders(replicas, sids[0])[0]
    mine = [s for s in sids if holders(replicas, s) == [victim]]
    before = {s: httpx.get(f"{router}/sessions/{s}/data", timeout=30).json()["entries"] for s in mine}
    replicas[victim].signal(signal.SIGKILL)
    replicas[victim].wait_exit(10)
    # While it is down its sessions are not answered by another replica.
    r = httpx.get(f"{router}/sessions/{mine[0]}/data", timeout=30)
    assert r.status_code == 502, r.text
    replicas[victim].start().wait_ready()
    for s in mine:
        r = httpx.get(f"{router}/sessions/{s}/data", timeout=30)
        assert r.status_code == 200 and r.json()["entries"] == before[s], r.text


def test_export_and_import_move_a_session_to_another_replica(cluster):
    router, replicas = cluster
    r = httpx.post(router + "/sessions", json={"window": 60}, timeout=30)
    sid = r.json()["id"]
    httpx.post(f"{router}/sessions/{sid}/flash", json={"query": "Where is it?", "max_tokens": 6}, timeout=30)
    r = httpx.post(f"{router}/sessions/{sid}/push", json={"data": [f"box {k} on shelf {k % 3}" for k in range(8)],
                                                          "wait": True}, timeout=30)
    assert r.status_code == 200, r.text
    home = holders(replicas, sid)[0]
    source = replicas[home]
    s_before, d_before = settle_session(source, sid)
    answer = flash_value(source, sid, s_before["data_version"])
    snap = httpx.get(f"{router}/sessions/{sid}/export", timeout=30).json()
    target = replicas[(home + 1) % REPLICAS]
    r = httpx.post(target.v1 + "/sessions/import", json=snap, headers={"x-layerscale-session-id": sid}, timeout=30)
    assert r.status_code == 200, r.text
    s_after, d_after = settle_session(target, sid)
    assert d_after == d_before
    assert flash_value(target, sid, s_after["data_version"]) == answer
    assert httpx.delete(f"{source.v1}/sessions/{sid}", timeout=30).status_code == 200


def flash_value(server, sid: str, version: int) -> str:
    deadline = time.monotonic() + 30
    while True:
        qs = httpx.get(f"{server.v1}/sessions/{sid}/flash", timeout=30).json()["data"]
        if qs and qs[0].get("data_version") == version:
            return qs[0]["value"]
        assert time.monotonic() < deadline, qs
        time.sleep(0.05)
