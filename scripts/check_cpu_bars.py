#!/usr/bin/env python3
"""Every target of the CPU-speed issue, checked against one benchmark run: each bar, its figure
in every round of the run, and whether it holds in all of them. Reads the raw result folders of
  scripts/bench_decode_vs_llamabench.sh (--core: SmolLM2 Q4_0/Q4_1 prefill, decode, depth),
  scripts/bench_serving_peers.sh (--serving: 1, 8, 32 streams against llama-server and vLLM),
  scripts/bench_qwen3_shape.sh (--qwen3: BF16 and Q8_0 prefill and decode),
any of which may be left out. Prints a markdown table; a bar with no figure is listed as such.
The same rules as the summaries: Vigil's median against llama-bench's mean (its better flash
attention setting where both ran), floors from the read bandwidth measured beside Vigil's run
(`summarize_decode_bench.round_bandwidth`). Where a run has bench_core --floor's figures, a
second table gives each decode's share of a plain read of its own bytes, token by token (not
counted among the bars). Stdlib only.

Usage: scripts/check_cpu_bars.py [--core DIR] [--serving DIR] [--qwen3 DIR] [--q4_0 GGUF]"""
import argparse, glob, importlib.util, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_summarizer():
    spec = importlib.util.spec_from_file_location("summarize_decode_bench", os.path.join(HERE, "summarize_decode_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Bars:
    """Rows of (figure, bar, per-round values, met per round)."""

    def __init__(self):
        self.rows = []
        self.reads = []

    def add(self, figure, bar, values, met):
        self.rows.append((figure, bar, values, met))

    def add_read(self, figure, values):
        """A decode's share of a plain read of its own bytes, token by token (bench_core
        --floor), per round: reported beside the bars, not counted among them."""
        if values:
            self.reads.append((figure, values))

    def print(self):
        print("| figure | bar | each round | holds |")
        print("|---|---|---|---|")
        for figure, bar, values, met in self.rows:
            if not met:
                holds = "no figure"
            elif all(met):
                holds = "**yes**"
            elif any(met):
                holds = f"in {sum(met)} of {len(met)} rounds"
            else:
                holds = "no"
            print(f"| {figure} | {bar} | {' · '.join(values) or '–'} | {holds} |")
        held = sum(1 for *_, met in self.rows if met and all(met))
        print(f"\n{held} of {len(self.rows)} bars hold in every round.")
        if self.reads:
            print("\n| decode tg128, share of a plain read of the bytes it reads, token by token | each round |")
            print("|---|---|")
            for figure, values in self.reads:
                print(f"| {figure} | {' · '.join(values)} |")


def read_figure(share, dispatches):
    """One round's decode share of a plain read, and where bench_core printed them, its matmuls
    replayed alone and the read cut at the step's dispatches, with the decode's share of that cut
    read (the bar proposed for weights streamed from DRAM: docs/benchmarks.md, "What a decode
    step's dispatches cost")."""
    text = f"{share[0]:.0f} % (read {share[3]:.1f} GB/s)"
    if dispatches:
        matmuls, by_job = dispatches
        text += f"; matmuls alone {matmuls:.0f} %, read by job {by_job:.0f} % (decode at {100 * share[0] / by_job:.0f} % of it)"
    return text


def rounds(d, pattern):
    """Round numbers r with a file `pattern % r` in d, in order."""
    found = []
    r = 1
    while os.path.exists(os.path.join(d, pattern % r)):
        found.append(r)
        r += 1
    return found


def core(bars, d, q4_0):
    s = load_summarizer()
    files = {"Q4_0": q4_0, "Q4_1": os.path.join(HERE, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")}
    rs = rounds(d, "bandwidth-%d.json")
    for name, path in files.items():
        f = name.lower()
        wbytes, kv = s.bytes_per_token(path)
        per = {k: ([], []) for k in ("pp512", "pp2048", "tg128", "tg128 floor", "depth floor")}
        reads = []
        for r in rs:
            bw = s.round_bandwidth(d, r, f)
            vpath = os.path.join(d, f"vigil-{f}-{r}.jsonl")
            if not os.path.exists(vpath):
                continue
            v = s.vigil(vpath)
            share = s.read_share(vpath)
            if share:
                reads.append(read_figure(share, s.dispatch_shares(vpath)))
            lb = s.llama(os.path.join(d, f"llama-{f}-fa1-{r}.json"))
            for test, bar in (("pp512", 2.0), ("pp2048", 2.0), ("tg128", 1.5)):
                if test in v and test in lb:
                    ratio = v[test][0] / lb[test][0]
                    per[test][0].append(f"×{ratio:.2f}")
                    per[test][1].append(ratio >= bar)
            if "tg128" in v:
                at = v["tg128"][0] / (bw / wbytes)
                per["tg128 floor"][0].append(f"{100 * at:.0f} %")
                per["tg128 floor"][1].append(at >= 0.9)
            if "tg64@d2048" in v:
                at = v["tg64@d2048"][0] / (bw / (wbytes + kv))
                per["depth floor"][0].append(f"{100 * at:.0f} %")
                per["depth floor"][1].append(at >= 0.75)
        bars.add(f"SmolLM2 {name} pp512 vs llama-bench", "≥ 2×", *per["pp512"])
        bars.add(f"SmolLM2 {name} pp2048 vs llama-bench", "≥ 2×", *per["pp2048"])
        bars.add(f"SmolLM2 {name} tg128 vs llama-bench", "≥ 1.5×", *per["tg128"])
        bars.add(f"SmolLM2 {name} tg128, share of its weight-read floor", "≥ 90 %", *per["tg128 floor"])
        bars.add(f"SmolLM2 {name} decode after 2,048 tokens, share of its weights + KV floor", "≥ 75 %", *per["depth floor"])
        bars.add_read(f"SmolLM2 {name}", reads)


def qwen3(bars, d):
    s = load_summarizer()
    for fmt, label in (("bf16", "BF16"), ("q8_0", "Q8_0")):
        reads = []
        for r in rounds(d, f"vigil-{fmt}-%d.jsonl"):
            vpath = os.path.join(d, f"vigil-{fmt}-{r}.jsonl")
            share = s.read_share(vpath)
            if share:
                reads.append(read_figure(share, s.dispatch_shares(vpath)))
        bars.add_read(f"Qwen3-0.6B shape {label}", reads)
        for test in ("pp512", "tg128"):
            values, met = [], []
            for r in rounds(d, f"vigil-{fmt}-%d.jsonl"):
                mine = {j["test"]: j for j in map(json.loads, open(os.path.join(d, f"vigil-{fmt}-{r}.jsonl"))) if "test" in j}
                try:
                    runs = json.load(open(os.path.join(d, f"llama-{fmt}-{r}.json")))
                except (OSError, ValueError):
                    continue
                want = (512, 0) if test == "pp512" else (0, 128)
                peer = [x["avg_ts"] for x in runs if (x["n_prompt"], x["n_gen"]) == want]
                if test in mine and peer:
                    ratio = mine[test]["tokens_per_s_median"] / max(peer)
                    values.append(f"×{ratio:.2f}")
                    met.append(ratio >= 1.5)
            bars.add(f"Qwen3-0.6B shape {label} {test} vs llama-bench", "≥ 1.5×", values, met)


def serving(bars, d):
    runs = []
    for path in sorted(glob.glob(os.path.join(d, "concurrent-*.json"))):
        doc = json.load(open(path))
        runs.append({t["name"]: {p["params"]["concurrency"]: p for p in t["points"] if not p.get("failed")} for t in doc["targets"]})

    def p50(point, metric):
        return point["metrics"][metric]["p50"]

    def ratio_rows(figure, bar, peer, conc, fn, test):
        values, met = [], []
        for run in runs:
            a, b = run.get("vigil", {}).get(conc), run.get(peer, {}).get(conc)
            if a and b:
                x = fn(a) / fn(b)
                values.append(f"×{x:.2f}")
                met.append(test(x))
        bars.add(figure, bar, values, met)

    out = lambda p: p["throughput"]["output_tok_s"]
    ratio_rows("serving output tok/s at 8 streams vs llama-server -np 8", "≥ 3×", "llama-server", 8, out, lambda x: x >= 3.0)
    ratio_rows("serving p50 TTFT at 8 streams vs llama-server", "≤ 0.3×", "llama-server", 8, lambda p: p50(p, "ttft_ms"), lambda x: x <= 0.3)
    for conc in (1, 8, 32):
        ratio_rows(f"serving p50 ITL at {conc} stream{'s' if conc > 1 else ''} vs llama-server", "≤ 1×", "llama-server", conc,
                   lambda p: p50(p, "itl_ms"), lambda x: x <= 1.0)
    for conc in (1, 8, 32):
        ratio_rows(f"serving output tok/s at {conc} stream{'s' if conc > 1 else ''} vs vLLM's CPU build", "ahead (> 1×)", "vllm-cpu", conc,
                   out, lambda x: x > 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--core")
    ap.add_argument("--serving")
    ap.add_argument("--qwen3")
    ap.add_argument("--q4_0", default="/tmp/smol-q4_0.gguf")
    a = ap.parse_args()
    if not (a.core or a.serving or a.qwen3):
        ap.error("give at least one of --core, --serving, --qwen3")
    for d in (a.core, a.serving, a.qwen3):
        if d and os.path.exists(os.path.join(d, "cpu.txt")):
            lines = open(os.path.join(d, "cpu.txt")).read().splitlines()
            caps = next((l for l in lines if l.startswith("VIGIL_MAX_ISA")), "")
            print(f"- `{d}`: {lines[0].split(':', 1)[-1].strip()}{'; ' + caps if caps else ''}")
    print()
    bars = Bars()
    if a.core:
        core(bars, a.core, a.q4_0)
    if a.serving:
        serving(bars, a.serving)
    if a.qwen3:
        qwen3(bars, a.qwen3)
    bars.print()


if __name__ == "__main__":
    sys.exit(main())
