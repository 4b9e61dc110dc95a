#!/usr/bin/env python3
"""Figures for durable sessions (docs/benchmarks.md, "Durable sessions"), against a release
`vigil serve` on SmolLM2:

  push   push acknowledgements per second with the journal on (--state-dir) and off
         (--no-persist): N clients each pushing one entry per request in a closed loop for T
         seconds; rounds alternate on/off. Also the journal's records per fsync (group commit).
  restart  restart time for S sessions of ~L tokens after kill -9: until /health is 200 and
         until every session's KV is resident again, with the KV read back from disk
         (--kv-disk) and recomputed (no KV files); rounds alternate.

Usage: scripts/bench_durable.py --bin target/release/vigil --model M.gguf [--out FILE.json]
Needs httpx (.cache/venv/bin/python has it). Prints a JSON summary; writes it to --out."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu() -> dict:
    info = Path("/proc/cpuinfo").read_text()
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), platform.processor())
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    keep = [f for f in flags if f.startswith(("avx", "fma", "f16c", "amx"))]
    return {"model": model, "flags": keep, "cores": os.cpu_count()}


class Server:
    def __init__(self, bin_: str, model: str, args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [bin_, "serve", "--model", model, "--port", str(self.port), "--threads", "2", *args]
        self.log = tempfile.NamedTemporaryFile(prefix="vigil-bench-durable-", suffix=".log", delete=False)
        self.proc = None

    def start(self) -> float:
        """Start; seconds until /health is 200."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-3000:]}")
            time.sleep(0.02)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0


def push_round(bin_, model, persist: bool, clients: int, seconds: float) -> dict:
    state = tempfile.mkdtemp(prefix="vigil-bench-state-")
    args = ["--state-dir", state] if persist else ["--no-persist"]
    s = Server(bin_, model, args + ["--kv-memory", "1GiB"])
    s.start()
    try:
        sids = []
        for i in range(clients):
            # A window keeps ingest cheap and bounded: the figure is the ack path, not prefill.
            r = httpx.post(s.url + "/v1/sessions", json={"window": 512}, timeout=30)
            sids.append(r.json()["id"])
        counts = [0] * clients
        lat = [[] for _ in range(clients)]
        stop_at = time.monotonic() + seconds

        def loop(i: int) -> None:
            with httpx.Client(timeout=30) as c:
                k = 0
                while time.monotonic() < stop_at:
                    t = time.monotonic()
                    r = c.post(f"{s.url}/v1/sessions/{sids[i]}/push", json={"data": f"client {i} reading {k}: {k % 97}"})
                    if r.status_code == 200:
                        counts[i] += 1
                        lat[i].append((time.monotonic() - t) * 1000)
                    k += 1

        records0, syncs0 = s.metric("vigil_state_log_records_total"), s.metric("vigil_state_log_syncs_total")
        t0 = time.monotonic()
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        records = s.metric("vigil_state_log_records_total") - records0
        syncs = s.metric("vigil_state_log_syncs_total") - syncs0
        all_lat = sorted(x for l in lat for x in l)
        return {
            "persist": persist,
            "acks_per_s": sum(counts) / wall,
            "ack_ms_p50": all_lat[len(all_lat) // 2],
            "ack_ms_p99": all_lat[int(len(all_lat) * 0.99)],
            "records_per_sync": records / syncs if syncs else None,
        }
    finally:
        s.stop()
        shutil.rmtree(state, ignore_errors=True)


def entries_for(tokens: int) -> list[str]:
    # About 54 tokens each with SmolLM2's tokenizer (the opening adds a few dozen).
    n = max(1, round(tokens / 54))
    return [f"sensor {k:04d} at site {k % 17}: temperature {20 + k % 9}.{k % 7} C, humidity {40 + k % 23} percent, "
            f"pressure {1000 + k % 31} hPa, wind {k % 13} km/h from {['north', 'east', 'south', 'west'][k % 4]}, status nominal"
            for k in range(n)]


def restart_round(bin_, model, sessions: int, tokens: int, read_back: bool) -> dict:
    state = tempfile.mkdtemp(prefix="vigil-bench-state-")
    args = ["--state-dir", state, "--kv-memory", "6GiB", "--max-sessions", str(max(256, sessions))]
    if read_back:
        args += ["--kv-disk", "16GiB"]
    s = Server(bin_, model, args)
    s.start()
    try:
        data = entries_for(tokens)
        sids = []
        for i in range(sessions):
            r = httpx.post(s.url + "/v1/sessions", json={}, timeout=30)
            sid = r.json()["id"]
            sids.append(sid)
            r = httpx.post(f"{s.url}/v1/sessions/{sid}/push", json={"data": [f"{i}: {e}" for e in data], "wait": True,
                                                                      "wait_timeout": 600}, timeout=700)
            assert r.status_code == 200 and r.json()["resident"], r.text
        held = [httpx.get(f"{s.url}/v1/sessions/{sid}", timeout=30).json()["tokens"] for sid in sids]
        if read_back:
            kv = Path(state) / "kv"
            deadline = time.monotonic() + 600
            while len(list(kv.glob("*.kv"))) < sessions:
                assert time.monotonic() < deadline, "KV files were not all written"
                time.sleep(0.2)
        s.kill9()
        t0 = time.monotonic()
        ready = s.start()
        pending = set(sids)
        while pending:
            for sid in list(pending):
                j = httpx.get(f"{s.url}/v1/sessions/{sid}", timeout=30).json()
                if j["kv_tokens"] + 1 >= j["tokens"]:
                    pending.discard(sid)
            time.sleep(0.05)
        resident = time.monotonic() - t0
        return {"read_back": read_back, "sessions": sessions, "tokens_per_session": statistics.median(held),
                "health_s": ready, "all_resident_s": resident}
    finally:
        s.stop()
        shutil.rmtree(state, ignore_errors=True)


def summarize(rows: list[dict], key: str) -> dict:
    v = sorted(r[key] for r in rows if r[key] is not None)
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v)} if v else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--what", default="push,restart")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--restart-rounds", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    out = {"cpu": cpu(), "command": " ".join(os.sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if "push" in a.what:
        rows = []
        for _ in range(a.rounds):
            for persist in (True, False):
                rows.append(push_round(a.bin, a.model, persist, a.clients, a.seconds))
                print(json.dumps(rows[-1]), flush=True)
        out["push"] = {
            "rounds": rows,
            "on": {k: summarize([r for r in rows if r["persist"]], k) for k in ("acks_per_s", "ack_ms_p50", "ack_ms_p99", "records_per_sync")},
            "off": {k: summarize([r for r in rows if not r["persist"]], k) for k in ("acks_per_s", "ack_ms_p50", "ack_ms_p99")},
        }
    if "restart" in a.what:
        rows = []
        for _ in range(a.restart_rounds):
            for read_back in (True, False):
                rows.append(restart_round(a.bin, a.model, a.sessions, a.tokens, read_back))
                print(json.dumps(rows[-1]), flush=True)
        out["restart"] = {
            "rounds": rows,
            "read_back": {k: summarize([r for r in rows if r["read_back"]], k) for k in ("health_s", "all_resident_s")},
            "recompute": {k: summarize([r for r in rows if not r["read_back"]], k) for k in ("health_s", "all_resident_s")},
        }
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
