#!/usr/bin/env python3
"""What structured outputs cost per token (docs/benchmarks.md, "Structured outputs"): N
concurrent streaming chat completions against a release `vigil serve`, each asking for a JSON
object under a schema (`response_format: json_schema`), against the same requests
unconstrained. Rounds alternate constrained / free; each round's streams start together. The
figure is the inter-token latency of every stream (ms between content chunks after the
first), p50 and p95 over all streams of a round, and output tokens per second of the round.

Usage: scripts/bench_structured.py --bin target/release/vigil --model M.gguf [--streams 8]
  [--rounds 3] [--max-tokens 96] [--out FILE.json]
Needs httpx (.cache/venv/bin/python has it)."""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import httpx

from sse_chunks import stream_chunks

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population_millions": {"type": "number"},
        "landmarks": {"type": "array", "items": {"type": "string"}},
        "coastal": {"type": "boolean"},
    },
    "required": ["name", "country", "population_millions", "landmarks", "coastal"],
    "additionalProperties": False,
}
CITIES = ["Lisbon", "Oslo", "Lima", "Hanoi", "Cairo", "Quito", "Perth", "Bergen", "Osaka", "Porto"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu() -> dict:
    info = {"machine": platform.machine()}
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and "model" not in info:
            info["model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags") and "flags" not in info:
            flags = line.split(":", 1)[1].split()
            info["flags"] = [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))]
    return info


def one(url: str, i: int, constrained: bool, max_tokens: int, out: list) -> None:
    body = {
        "messages": [{"role": "user", "content": f"Describe {CITIES[i % len(CITIES)]} as a JSON object."}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": True,
    }
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    times = []
    text, finish = "", None
    for chunk in stream_chunks(url + "/v1/chat/completions", body):
        for c in chunk.get("choices", []):
            finish = c.get("finish_reason") or finish
            piece = c["delta"].get("content")
            if piece:
                times.append(time.perf_counter())
                text += piece
    if constrained and finish == "stop":
        json.loads(text)  # a constrained answer that finished must parse
    out.append({"tokens": len(times), "finish": finish, "itl_ms": [(b - a) * 1e3 for a, b in zip(times, times[1:])],
                "span_s": times[-1] - times[0] if len(times) > 1 else 0.0})


def round_(url: str, streams: int, constrained: bool, max_tokens: int, seed0: int) -> dict:
    out: list = []
    threads = [threading.Thread(target=one, args=(url, seed0 + i, constrained, max_tokens, out)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    itl = sorted(x for s in out for x in s["itl_ms"])
    tokens = sum(s["tokens"] for s in out)
    return {
        "constrained": constrained,
        "streams": len(out),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "itl_p50_ms": round(statistics.median(itl), 2),
        "itl_p95_ms": round(itl[int(0.95 * (len(itl) - 1))], 2),
        "tok_s": round(tokens / wall, 1),
        "finished_json": sum(1 for s in out if s["finish"] == "stop") if constrained else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    port = free_port()
    state = tempfile.mkdtemp(prefix="vigil-bench-structured-")
    server = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(port), "--threads",
                               str(a.threads), "--state-dir", state], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        round_(url, 2, True, 16, 1000)  # warm-up: builds the grammar tables
        rounds = []
        for r in range(a.rounds):
            for constrained in (True, False):
                res = round_(url, a.streams, constrained, a.max_tokens, 100 * r)
                print(json.dumps(res), flush=True)
                rounds.append(res)
    finally:
        server.terminate()
        server.wait()
    summary = {}
    for constrained in (True, False):
        rs = [r for r in rounds if r["constrained"] == constrained]
        summary["constrained" if constrained else "free"] = {
            k: {"median": statistics.median(r[k] for r in rs), "min": min(r[k] for r in rs), "max": max(r[k] for r in rs)}
            for k in ("itl_p50_ms", "itl_p95_ms", "tok_s")
        }
    result = {"cpu": cpu(), "streams": a.streams, "max_tokens": a.max_tokens, "threads": a.threads,
              "rounds": rounds, "summary": summary}
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
