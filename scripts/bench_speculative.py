#!/usr/bin/env python3
"""Speculative decoding, side by side in one run (docs/benchmarks.md, "Speculative decoding").

Part 1, one server, each request choosing its method (`speculative: off | suffix | ngram`),
methods alternating within every round so they share the machine's state:
  - repeat: markup repeated with one change (the edit an agent asks for), until the model stops;
  - free: free-text prompts, 128 tokens (`ignore_eos`).
Decode rate of a request: (output tokens - 1) / (last token time - first token time), streamed.

Part 2, `vigil bench` agent-loop and tool-loop against two servers of the same model, one with
`--speculative off` and one with `--speculative suffix`, as two targets of one run; decode rate
= 1000 / itl_ms of each measured turn.

Part 4, with --concurrency N: N streams at once on one server, every stream of a round using
the same method (rounds alternate off / suffix): free text (each stream one of the free
prompts, 128 tokens) and the repeat. Aggregate output tok/s = all tokens / the round's wall
time, beside each stream's decode rate.

Part 3, with --llamacpp DIR (scripts/setup_llamacpp.sh's build): llama-server on the same file,
same threads, without and with its own n-gram speculation (`--spec-type ngram-simple`), on part
1's prompts.

Prints a Markdown table (medians with min-max, ratios against off) and writes every raw sample
to OUT/speculative.json.

    setsid bash -c 'echo -19 > /proc/self/autogroup; python3 scripts/bench_speculative.py \\
        --vigil target/release/vigil --model .cache/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/spec'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sse_chunks import stream_chunks

PAGE = """<html>
  <head>
    <title>Index</title>
    <meta charset="utf-8">
    <link rel="stylesheet" href="style.css">
  </head>
  <body>
    <header>
      <h1>Welcome to the garden club</h1>
      <nav>
        <a href="index.html">Home</a>
        <a href="events.html">Events</a>
        <a href="members.html">Members</a>
        <a href="contact.html">Contact</a>
      </nav>
    </header>
    <main>
      <p>Our next meeting is on Saturday at ten in the community hall.</p>
      <p>Bring seeds to swap and a cup for tea.</p>
      <ul>
        <li>Tomatoes: start indoors in March</li>
        <li>Beans: sow outside after the last frost</li>
        <li>Lettuce: sow every two weeks</li>
      </ul>
    </main>
    <footer>
      <p>Garden club, 12 Mill Lane</p>
    </footer>
  </body>
</html>"""

REPEAT = [
    f"Repeat this HTML exactly, changing the title to 'Home':\n{PAGE}",
    f"Repeat this HTML exactly, changing the meeting day from Saturday to Sunday:\n{PAGE}",
]
FREE = [
    "Tell me a short story about a lighthouse keeper and a storm.",
    "Explain how a bicycle gear system works to a ten-year-old.",
    "Write a letter to a friend describing your first week in a new city.",
]
METHODS = ["off", "suffix", "ngram"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command: list[str], port: int, name: str) -> tuple[subprocess.Popen, str]:
    """Start a server and wait for its /health; its log goes to a temporary file."""
    log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{name} did not start: {log.name}")


def start(vigil: str, model: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    return launch([vigil, "serve", "--model", model, "--port", str(port), "--threads", str(threads),
                   "--kv-memory", "512MiB", "--no-persist", *extra], port, "vigil-spec")


def stream_chat(url: str, prompt: str, method: str, max_tokens: int, ignore_eos: bool,
                send_method: bool = True) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": ignore_eos}
    if send_method:
        body["speculative"] = method
    times, usage, text = [], None, []
    sent = time.perf_counter()
    for chunk in stream_chunks(url + "/v1/chat/completions", body):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            if c.get("delta", {}).get("content"):
                times.append(time.perf_counter())
                text.append(c["delta"]["content"])
    n = usage["completion_tokens"]
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {
        "method": method, "tokens": n, "ttft_ms": (times[0] - sent) * 1e3 if times else None,
        "decode_tok_s": (n - 1) / span if span > 0 else None,
        "text": "".join(text),
    }


def spec_counts(url: str) -> tuple[float, float]:
    """Vigil's draft tokens accepted and verified since start (/metrics)."""
    accepted = proposed = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vigil_spec_accepted_tokens_total "):
            accepted = float(line.split()[1])
        elif line.startswith("vigil_spec_proposed_tokens_total "):
            proposed = float(line.split()[1])
    return accepted, proposed


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def part_one(url: str, rounds: int) -> list[dict]:
    samples = []
    for r in range(rounds):
        for kind, prompts, max_tokens, ignore in (("repeat", REPEAT, 400, False), ("free", FREE, 128, True)):
            for i, p in enumerate(prompts):
                # Rotate the order each round so no method always runs first.
                order = METHODS[(r + i) % 3:] + METHODS[:(r + i) % 3]
                for m in order:
                    a0, p0 = spec_counts(url)
                    s = stream_chat(url, p, m, max_tokens, ignore)
                    a1, p1 = spec_counts(url)
                    s.update(workload=kind, prompt=i, round=r, accepted=a1 - a0, rejected=(p1 - p0) - (a1 - a0))
                    samples.append(s)
    # Greedy: every method produced the same text.
    for kind in ("repeat", "free"):
        for i in range(len(REPEAT if kind == "repeat" else FREE)):
            texts = {s["text"] for s in samples if s["workload"] == kind and s["prompt"] == i}
            assert len(texts) == 1, f"{kind} prompt {i}: outputs differ across methods"
    return samples


def start_llamacpp(bindir: str, model: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    return launch([f"{bindir}/llama-server", "-m", model, "--port", str(port), "-t", str(threads), "-c", "4096",
                   "--jinja", *extra], port, "llama-server")


def part_three(bindir: str, model: str, threads: int, rounds: int) -> list[dict]:
    """llama-server without and with its n-gram speculation, alternating per prompt."""
    servers = {}
    samples = []
    try:
        servers["llama.cpp"] = start_llamacpp(bindir, model, threads, [])
        servers["llama.cpp+ngram"] = start_llamacpp(bindir, model, threads, ["--spec-type", "ngram-simple"])
        for r in range(rounds):
            for kind, prompts, max_tokens, ignore in (("repeat", REPEAT, 400, False), ("free", FREE, 128, True)):
                for i, p in enumerate(prompts):
                    names = list(servers)
                    if (r + i) % 2:
                        names.reverse()
                    for name in names:
                        s = stream_chat(servers[name][1], p, name, max_tokens, ignore, send_method=False)
                        s.update(workload=kind, prompt=i, round=r)
                        samples.append(s)
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait()
    return samples


def part_four(url: str, streams: int, rounds: int) -> list[dict]:
    import concurrent.futures as cf
    samples = []
    for r in range(rounds):
        for kind, prompts, max_tokens, ignore in (("repeat", REPEAT, 400, False), ("free", FREE, 128, True)):
            order = ["off", "suffix"] if r % 2 == 0 else ["suffix", "off"]
            for m in order:
                a0, p0 = spec_counts(url)
                t0 = time.perf_counter()
                with cf.ThreadPoolExecutor(streams) as pool:
                    futures = [pool.submit(stream_chat, url, prompts[i % len(prompts)], m, max_tokens, ignore)
                               for i in range(streams)]
                    results = [f.result() for f in futures]
                wall = time.perf_counter() - t0
                a1, p1 = spec_counts(url)
                tokens = sum(x["tokens"] for x in results)
                samples.append({"workload": f"{kind} ×{streams}", "method": m, "round": r,
                                "aggregate_tok_s": tokens / wall,
                                "decode_tok_s": statistics.median(x["decode_tok_s"] for x in results if x["decode_tok_s"]),
                                "accepted": a1 - a0, "rejected": (p1 - p0) - (a1 - a0)})
    return samples


def part_two(vigil: str, model: str, urls: dict[str, str], out: Path, turns: int) -> list[dict]:
    samples = []
    for workload in ("agent-loop", "tool-loop"):
        wdir = out / workload
        wdir.mkdir(parents=True, exist_ok=True)
        targets = [a for name, u in urls.items() for a in ("--target", f"{name}={u}")]
        subprocess.run([vigil, "bench", "run", *targets, "--workload", workload, "--out", str(wdir),
                        "--warmup", "1", "--iterations", "3", "--turns", str(turns), "--prefix-tokens", "1024",
                        "--no-session-loops"], check=True)
        result = json.loads(sorted(wdir.glob("*.json"))[-1].read_text())
        for t in result["targets"]:
            for point in t["points"]:
                for s in point["samples"]:
                    if s["warmup"] or not s.get("itl_ms"):
                        continue
                    samples.append({"workload": workload, "method": t["name"], "turn": s.get("turn"),
                                    "tokens": s.get("output_tokens"), "decode_tok_s": 1000.0 / s["itl_ms"]})
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=0, help="part 4's stream count (0: skip it)")
    ap.add_argument("--parts", default="1,2,3,4", help="which parts to run (3 and 4 also need their flags)")
    ap.add_argument("--llamacpp", help="directory holding llama-server (scripts/setup_llamacpp.sh)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    isa = [f for f in flags if f.startswith(("avx512", "avx_vnni", "avx2", "fma", "f16c", "amx"))]

    parts = {int(p) for p in args.parts.split(",")}
    proc, url = start(args.vigil, args.model, args.threads, [])
    try:
        one = part_one(url, args.rounds) if 1 in parts else []
        four = part_four(url, args.concurrency, args.rounds + 1) if args.concurrency and 4 in parts else []
    finally:
        proc.terminate()
        proc.wait()
    servers = {}
    two = []
    try:
        if 2 in parts:
            for name in ("off", "suffix"):
                servers[name] = start(args.vigil, args.model, args.threads, ["--speculative", name])
            two = part_two(args.vigil, args.model, {n: u for n, (_, u) in servers.items()}, out, args.turns)
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait()
    three = part_three(args.llamacpp, args.model, args.threads, args.rounds) if args.llamacpp and 3 in parts else []
    samples = one + two + three + four
    (out / "speculative.json").write_text(json.dumps({
        "cpu": cpu, "isa": isa, "threads": args.threads, "model": os.path.basename(args.model),
        "command": " ".join(sys.argv), "samples": samples}, indent=1))
    print(f"CPU: {cpu}; {args.threads} threads; {os.path.basename(args.model)}")
    print("| workload | server, method | decode tok/s, median (min–max) | × without speculation (medians) | accepted / drafted |")
    print("|---|---|---|---|---|")
    for workload in ("repeat", "free", "agent-loop", "tool-loop"):
        base = [s["decode_tok_s"] for s in samples if s["workload"] == workload and s["method"] == "off" and s["decode_tok_s"]]
        for m in METHODS + ["llama.cpp", "llama.cpp+ngram"]:
            if m == "llama.cpp":
                base = [s["decode_tok_s"] for s in samples if s["workload"] == workload and s["method"] == m and s["decode_tok_s"]]
            rows = [s for s in samples if s["workload"] == workload and s["method"] == m and s["decode_tok_s"]]
            if not rows or not base:
                continue
            rates = [s["decode_tok_s"] for s in rows]
            ratio = statistics.median(rates) / statistics.median(base)
            acc = int(sum(s.get("accepted", 0) for s in rows))
            drafted = acc + int(sum(s.get("rejected", 0) for s in rows))
            drafts = f"{acc} / {drafted}" if drafted else "–"
            print(f"| {workload} | {m} | {summary(rates)} | {ratio:.2f} | {drafts} |")
    if four:
        print()
        print("| workload | method | aggregate output tok/s, median (min–max) | × off | stream decode tok/s, median of rounds | accepted / drafted |")
        print("|---|---|---|---|---|---|")
        for workload in sorted({s["workload"] for s in four}):
            base = statistics.median(s["aggregate_tok_s"] for s in four if s["workload"] == workload and s["method"] == "off")
            for m in ("off", "suffix"):
                rows = [s for s in four if s["workload"] == workload and s["method"] == m]
                agg = [s["aggregate_tok_s"] for s in rows]
                acc = int(sum(s["accepted"] for s in rows))
                drafted = acc + int(sum(s["rejected"] for s in rows))
                print(f"| {workload} | {m} | {summary(agg)} | {statistics.median(agg) / base:.2f} | "
                      f"{statistics.median(s['decode_tok_s'] for s in rows):.1f} | {acc} / {drafted} |")


if __name__ == "__main__":
    main()
