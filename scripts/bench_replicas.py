#!/usr/bin/env python3
"""Three Vigil replicas behind nginx (deploy/nginx.conf, addresses rewritten to loopback)
against one replica alone, with `vigil bench` in one run: docs/benchmarks.md, "Durable
sessions". On one machine the replicas share its cores, so this is a correctness run of the
routed path (every session's turns reach the replica holding its KV), not a scaling figure.

Usage: scripts/bench_replicas.py --bin target/release/vigil --model M.gguf --out DIR [-- BENCH ARGS]
(default bench args: --workload agent-loop --prefix-tokens 2048 --turns 5 --warmup 1 --iterations 3)"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} at {url} never became healthy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", default="2")
    ap.add_argument("bench", nargs="*")
    a = ap.parse_args()
    bench = a.bench or "--workload agent-loop --prefix-tokens 2048 --turns 5 --warmup 1 --iterations 3".split()
    work = Path(tempfile.mkdtemp(prefix="vigil-replicas-"))
    procs = []
    try:
        ports = [free_port() for _ in range(4)]
        for i, port in enumerate(ports):
            log = open(work / f"replica-{i}.log", "wb")
            procs.append(subprocess.Popen(
                [a.bin, "serve", "--model", a.model, "--port", str(port), "--threads", a.threads,
                 "--kv-memory", "1GiB", "--state-dir", str(work / f"state-{i}")], stdout=log, stderr=subprocess.STDOUT))
        for port in ports:
            wait(f"http://127.0.0.1:{port}", "vigil")
        conf = (REPO / "deploy" / "nginx.conf").read_text()
        conf = re.sub(r"server vigil-(\d)\.vigil:8080", lambda m: f"server 127.0.0.1:{ports[int(m.group(1))]}", conf)
        router = free_port()
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{router};")
        temps = "".join(f"    {k}_temp_path {work}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = (f"user root;\ndaemon off;\npid {work}/nginx.pid;\nerror_log {work}/error.log;\n"
                + conf.replace("http {\n", f"http {{\n    access_log off;\n{temps}", 1))
        (work / "nginx.conf").write_text(conf)
        procs.append(subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(work / "nginx.conf")]))
        wait(f"http://127.0.0.1:{router}", "nginx")
        # Replica 3 stands alone; replicas 0-2 are behind the router.
        cmd = [a.bin, "bench", "run", *bench, "--out", a.out,
               f"--target=one-replica=http://127.0.0.1:{ports[3]}",
               f"--target=three-replicas-nginx=http://127.0.0.1:{router}"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
