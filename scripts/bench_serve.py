#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server: streamed /v1/completions at fixed concurrency.

For each concurrency level C, C client threads send --requests-per-level requests back to back
(closed loop), each a different --prompt-tokens prompt asking for exactly --max-tokens tokens
(temperature 0, `ignore_eos: true` and `min_tokens` so the model cannot stop early). Per level:
  output tok/s   all generated tokens / wall time of the level (first send to last byte)
  TTFT p50/p99   send → first chunk with text
  ITL mean       token-weighted: sum of (last − first text chunk) / sum of (tokens − 1)
One JSON line per level is appended to --out; a markdown table goes to stdout.

Prompts need no tokenizer: "Words:" followed by pseudo-words from a pool of 192. The server
tokenizes each pool word once (probe requests, max_tokens=1: usage.prompt_tokens of "Words: w"
minus that of "Words:"), so a prompt can be composed to the exact target; one full-length probe
checks the sum against the server's own count (±2% or abort). Prompts are drawn at random, no two
share their first two words, and timed prompts are never probed: requests share no prefix beyond
BOS and "Words:" (a few tokens, less than a KV block), so a prefix cache cannot help.

Generated-token counts come from the stream's usage (`stream_options.include_usage`) when the
server sends it; otherwise finish_reason "length" means max_tokens, and anything else falls back
to counting text chunks and is reported as short.

Launch modes start the server, wait for it, run, and stop it:
  --launch-llamacpp GGUF   python -m llama_cpp.server (llama-cpp-python, --server-python) with
                           --interrupt_requests False (by default it ends a running stream early,
                           with [DONE] and no finish_reason, as soon as another request waits) and
                           --logits_all False. It has no parallel slots: one global lock is held for
                           a whole request, so concurrent requests queue and run one at a time.
  --launch-vigil BIN       BIN serve --model GGUF --host 127.0.0.1 --port P --threads N (needs --gguf)

Usage: python3 scripts/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1,8,32 --out r.jsonl
       /work/venv/bin/python scripts/bench_serve.py --launch-llamacpp model.gguf --threads 2 ...
"""

import argparse
import http.client
import json
import os
import queue
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

HEADER = "Words:"
POOL_SIZE = 192
LENGTH_TOLERANCE = 0.02


# ---------------------------------------------------------------------------------------- HTTP


def get_json(url, path, timeout=10.0):
    with urllib.request.urlopen(url + path, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url, path, body, timeout):
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"POST {path}: HTTP {e.code}: {e.read()[:500]!r}") from e


@dataclass
class StreamResult:
    start: float
    end: float = 0.0
    chunk_times: list = field(default_factory=list)  # arrival of each chunk that carried text
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None


def stream_completion(url, body, timeout):
    """Sends one streamed completion and timestamps every SSE chunk that carries text."""
    parsed = urllib.parse.urlsplit(url)
    result = StreamResult(start=time.perf_counter())
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return result
        while line := resp.readline():
            if not line.startswith(b"data:"):
                continue  # blank separators, ": ping" comments, event names
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(payload)
            if "error" in chunk:
                result.error = json.dumps(chunk["error"])[:300]
                break
            result.usage = chunk.get("usage") or result.usage
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    result.chunk_times.append(now)
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        result.end = time.perf_counter()
        conn.close()
    return result


def completion_body(model, prompt, max_tokens, stream):
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        # Exactly max_tokens: `ignore_eos` (vLLM, llama.cpp's server, Vigil); `min_tokens` is
        # what llama-cpp-python honours (it bans EOS until then). Unknown fields are ignored.
        "ignore_eos": True,
        "min_tokens": max_tokens,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# ------------------------------------------------------------------------------------- prompts


def pseudo_words(rng, n):
    onsets = "b c d f g h j k l m n p r s t v w z br ch dr gl kr pl sh st th tr".split()
    vowels = "a e i o u ai ea ou".split()
    codas = ["", "", "", "n", "r", "s", "l", "m", "nd", "st"]
    words = set()
    while len(words) < n:
        syllables = rng.choice([1, 2, 2, 3])
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)))
    return sorted(words)


class PromptBuilder:
    """Composes prompts of an exact token count from pool words whose token costs the server told us."""

    def __init__(self, url, model, seed, timeout):
        self.rng = random.Random(seed)
        self.url, self.model, self.timeout = url, model, timeout
        self.pool = pseudo_words(self.rng, POOL_SIZE)
        self.header_tokens = self.count(HEADER)
        with ThreadPoolExecutor(4) as ex:
            counts = list(ex.map(lambda w: self.count(f"{HEADER} {w}"), self.pool))
        self.cost = {w: c - self.header_tokens for w, c in zip(self.pool, counts)}
        bad = [w for w, c in self.cost.items() if c <= 0]
        if bad:
            raise SystemExit(f"server tokenizes words across spaces ({bad[:3]} cost ≤ 0); cannot compose")
        self.used_openings = set()

    def count(self, prompt):
        reply = post_json(self.url, "/v1/completions", completion_body(self.model, prompt, 1, False), self.timeout)
        return reply["usage"]["prompt_tokens"]

    def build(self, target):
        """A fresh prompt of `target` tokens (predicted) and that prediction."""
        while True:
            words, tokens = [], self.header_tokens
            while True:
                fits = [w for w in self.pool if tokens + self.cost[w] <= target]
                if not fits:
                    break
                word = self.rng.choice(self.pool)
                word = word if word in fits else self.rng.choice(fits)
                words.append(word)
                tokens += self.cost[word]
            opening = tuple(words[:2])
            if opening not in self.used_openings:
                self.used_openings.add(opening)
                return f"{HEADER} {' '.join(words)}", tokens

    def check(self, target):
        """Probes one full-length prompt (never used for timing); returns (predicted, counted)."""
        prompt, predicted = self.build(target)
        counted = self.count(prompt)
        if abs(counted - target) > LENGTH_TOLERANCE * target:
            raise SystemExit(f"composed prompt is {counted} tokens by the server, predicted {predicted}")
        return predicted, counted


# ------------------------------------------------------------------------------------ measuring


def percentile(values, q):
    values = sorted(values)
    if not values:
        return None
    pos = (len(values) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def output_tokens(r, max_tokens):
    if r.usage and r.usage.get("completion_tokens") is not None:
        return r.usage["completion_tokens"]
    if r.finish_reason == "length":
        return max_tokens
    return len(r.chunk_times)


def run_level(args, model, prompts, concurrency):
    """Closed loop: `concurrency` threads each send the next prompt as soon as their last one ends."""
    todo = queue.Queue()
    for p in prompts:
        todo.put(p)
    results = []
    lock = threading.Lock()

    def worker():
        while True:
            try:
                prompt, predicted = todo.get_nowait()
            except queue.Empty:
                return
            body = completion_body(model, prompt, args.max_tokens, True)
            r = stream_completion(args.url, body, args.request_timeout)
            with lock:
                results.append((r, predicted))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize(args, concurrency, t0, results)


def summarize(args, concurrency, t0, results):
    ok = [(r, p) for r, p in results if r.error is None and r.chunk_times]
    for r, _ in results:
        if r.error or not r.chunk_times:
            print(f"request failed: {r.error or 'no text chunks'}", file=sys.stderr)
    wall = max((r.end for r, _ in results), default=t0) - t0
    n_out = [output_tokens(r, args.max_tokens) for r, _ in ok]
    ttft = [(r.chunk_times[0] - r.start) * 1e3 for r, _ in ok]
    decode_s = sum(r.chunk_times[-1] - r.chunk_times[0] for r, _ in ok)
    decode_tokens = sum(n - 1 for n in n_out)
    gaps = [(b - a) * 1e3 for r, _ in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    counted_prompt = [r.usage["prompt_tokens"] for r, _ in ok if r.usage and r.usage.get("prompt_tokens")]
    prompt_tokens = counted_prompt if len(counted_prompt) == len(ok) else [p for _, p in ok]

    def r2(x):
        return None if x is None else round(x, 2)

    return {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "short": sum(n < args.max_tokens for n in n_out),
        "prompt_tokens_mean": r2(sum(prompt_tokens) / len(prompt_tokens)) if ok else None,
        "prompt_tokens_min": min(prompt_tokens, default=None),
        "prompt_tokens_max": max(prompt_tokens, default=None),
        "prompt_tokens_source": "usage" if prompt_tokens is counted_prompt else "composed",
        "max_tokens": args.max_tokens,
        "output_tokens": sum(n_out),
        "output_tokens_source": "usage" if all(r.usage for r, _ in ok) else "finish_reason/chunks",
        "text_chunks": sum(len(r.chunk_times) for r, _ in ok),
        "wall_s": r2(wall),
        "output_tok_s": r2(sum(n_out) / wall) if wall > 0 else None,
        "requests_per_s": round(len(ok) / wall, 4) if wall > 0 else None,
        "ttft_p50_ms": r2(percentile(ttft, 50)),
        "ttft_p99_ms": r2(percentile(ttft, 99)),
        "itl_mean_ms": r2(decode_s * 1e3 / decode_tokens) if decode_tokens else None,
        "chunk_gap_p99_ms": r2(percentile(gaps, 99)),
        "e2e_p50_ms": r2(percentile([(r.end - r.start) * 1e3 for r, _ in ok], 50)),
    }


# ------------------------------------------------------------------------------------ launching


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, log_path, timeout):
    """Ready when /health says 200, or (servers without /health) when /v1/models answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; log {log_path}:\n{tail(log_path)}")
        for path in ("/health", "/v1/models"):
            try:
                get_json(url, path, timeout=5)
                return
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    break  # e.g. 503 while loading: not ready yet
            except (OSError, json.JSONDecodeError):
                break
        time.sleep(0.5)
    raise SystemExit(f"server not ready after {timeout}s; log {log_path}:\n{tail(log_path)}")


def tail(path, n=20):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def launch_command(args, port):
    if args.launch_llamacpp:
        n_ctx = max(2048, int(args.prompt_tokens * (1 + LENGTH_TOLERANCE)) + args.max_tokens + 64)
        # n_threads_batch defaults to all cores, n_threads to half: pin both to --threads. The server
        # defaults to logits_all (logits of every prompt token, for logprobs); llama.cpp's own does not.
        cmd = [args.server_python, "-m", "llama_cpp.server", "--model", args.launch_llamacpp,
               "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(args.threads),
               "--n_threads_batch", str(args.threads), "--n_ctx", str(n_ctx),
               "--flash_attn", str(args.flash_attn), "--interrupt_requests", "False", "--logits_all", "False",
               "--verbose", "False"]
        version = subprocess.run([args.server_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        return cmd, f"llama-cpp-python {version}"
    if not args.gguf:
        raise SystemExit("--launch-vigil needs --gguf")
    cmd = [args.launch_vigil, "serve", "--model", args.gguf, "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(args.threads)]
    return cmd, "vigil"


# ----------------------------------------------------------------------------------------- main


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model-name", help="model field to send (default: first id of /v1/models)")
    ap.add_argument("--label", help="server label in the results (default: from the launch mode or URL)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests-per-level", type=int, help="default max(2 × concurrency, 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--out", help="append one JSON line per level here")
    launch = ap.add_mutually_exclusive_group()
    launch.add_argument("--launch-llamacpp", metavar="GGUF")
    launch.add_argument("--launch-vigil", metavar="BIN")
    ap.add_argument("--gguf", help="model for --launch-vigil")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, help="port for a launched server (default: a free one)")
    ap.add_argument("--server-python", default=sys.executable, help="python with llama-cpp-python[server]")
    ap.add_argument("--flash-attn", default=True, type=lambda s: s.lower() in ("1", "true", "on"),
                    help="llama-cpp-python flash attention (default on, as llama.cpp's 'auto' on CPU)")
    ap.add_argument("--startup-timeout", type=float, default=300)
    return ap.parse_args()


def benchmark(args, label, extra):
    model = args.model_name or get_json(args.url, "/v1/models")["data"][0]["id"]
    levels = [int(c) for c in args.concurrency.split(",")]
    t = time.perf_counter()
    builder = PromptBuilder(args.url, model, args.seed, args.request_timeout)
    predicted, counted = builder.check(args.prompt_tokens)
    print(f"calibrated {POOL_SIZE} words in {time.perf_counter() - t:.1f}s; check prompt: composed "
          f"{predicted} tokens, server counted {counted}", file=sys.stderr)
    # One untimed streamed request: warms the streaming path and checks it works at all.
    warm = stream_completion(args.url, completion_body(model, builder.build(args.prompt_tokens)[0], 8, True),
                             args.request_timeout)
    if warm.error or not warm.chunk_times:
        raise SystemExit(f"warm-up stream failed: {warm.error or 'no text chunks'}")
    plans = [(c, [builder.build(args.prompt_tokens) for _ in range(args.requests_per_level or max(2 * c, 8))])
             for c in levels]
    common = {"server": label, "url": args.url, "model": model, "date": time.strftime("%FT%TZ", time.gmtime()),
              "cores": os.cpu_count(), "prompt_tokens_target": args.prompt_tokens,
              "calibration": {"composed": predicted, "counted": counted}, **extra}
    rows = []
    for c, prompts in plans:
        row = {**common, **run_level(args, model, prompts, c)}
        rows.append(row)
        print(f"concurrency {c}: {row['output_tok_s']} tok/s, TTFT p50 {row['ttft_p50_ms']} ms", file=sys.stderr)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print_table(rows)


def print_table(rows):
    cols = [("server", "server"), ("concurrency", "conc"), ("requests", "reqs"), ("prompt_tokens_mean", "prompt tok"),
            ("output_tokens", "out tok"), ("wall_s", "wall s"), ("output_tok_s", "out tok/s"),
            ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("itl_mean_ms", "ITL mean ms"),
            ("short", "short"), ("failed", "failed")]
    print("| " + " | ".join(h for _, h in cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k, _ in cols) + " |")


def main():
    args = parse_args()
    if not (args.launch_llamacpp or args.launch_vigil):
        try:
            benchmark(args, args.label or urllib.parse.urlsplit(args.url).netloc, {})
        except urllib.error.URLError as e:
            raise SystemExit(f"cannot reach {args.url}: {e.reason}") from e
        return
    port = args.port or free_port()
    args.url = f"http://127.0.0.1:{port}"
    cmd, label = launch_command(args, port)
    log_fd, log_path = tempfile.mkstemp(prefix="bench_serve-", suffix=".log")
    env = {"OMP_WAIT_POLICY": "passive", **os.environ}  # as scripts/bench_core.sh: no spinning on 2 cores
    print(f"launching: {' '.join(cmd)}  (log {log_path})", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(args.url, proc, log_path, args.startup_timeout)
        benchmark(args, args.label or label, {"threads": args.threads, "server_cmd": " ".join(cmd)})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(log_fd)


if __name__ == "__main__":
    main()
