#!/usr/bin/env python3
"""Markdown summary of scripts/bench_decode_vs_llamabench.sh's OUT_DIR: per file and round,
Vigil against llama-bench (prefill with flash attention on; decode after 2,048 tokens with it off
and on), and the decode floors of the same round: weight bytes per token (the GGUF's tensor
data, token_embd read once as the tied output head) and, after 2,048 tokens, the F16 KV read
(layers x 2 x kv_dim x 2 bytes x the mean context of the 64 decoded tokens), divided by the
read bandwidth measured beside Vigil's run of that file (the mean of the readings just before
and just after it, `round_bandwidth`; older runs have one reading per round). Runs made with
bench_core --floor also show tg128's share of a plain read of the bytes it reads, the two
alternated token by token in one process (`read_share`). Stdlib only.

Usage: scripts/summarize_decode_bench.py OUT_DIR [Q4_0_GGUF]"""
import json, os, struct, sys

def gguf_layout(path):
    """(tensor data bytes, metadata dict of scalars) of a GGUF file."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    p = 0
    def take(fmt):
        nonlocal p
        v = struct.unpack_from("<" + fmt, data, p); p += struct.calcsize("<" + fmt); return v[0]
    def string():
        nonlocal p
        n = take("Q"); s = data[p:p + n].decode("utf-8", "replace"); p += n; return s
    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def value(t):
        if t == 8: return string()
        if t == 9:
            et = take("I"); n = take("Q")
            return [value(et) for _ in range(n)] if et in (8, 9) else [take(sizes[et]) for _ in range(n)]
        return take(sizes[t])
    assert data[:4] == b"GGUF"; p = 4
    take("I"); n_tensors = take("Q"); n_kv = take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string(); v = value(take("I"))
        if not isinstance(v, list): meta[k] = v
    for _ in range(n_tensors):
        string(); nd = take("I"); [take("Q") for _ in range(nd)]; take("I"); take("Q")
    align = meta.get("general.alignment", 32)
    start = (p + align - 1) // align * align
    return os.path.getsize(path) - start, meta

def bytes_per_token(path):
    """(weight bytes a decoded token reads, F16 KV bytes it reads at 2,048 deep: layers x 2 x
    kv_dim x 2 bytes x the mean context of the 64 decoded tokens) of a GGUF file."""
    wbytes, meta = gguf_layout(path)
    arch = meta["general.architecture"]
    layers = meta[f"{arch}.block_count"]
    kv_dim = meta[f"{arch}.attention.head_count_kv"] * meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"]
    return wbytes, layers * 2 * kv_dim * 2 * (2048 + 32)

def round_bandwidth(d, r, f):
    """Read bandwidth in bytes/s for file `f`'s figures in round `r`: the mean of the readings
    taken just before and just after its Vigil run (bandwidth-R-F-before/after.json), where
    the run took them; else the one reading at the round's start (bandwidth-R.json). A shared
    host's DRAM rate moves by a third within minutes, so the bracket is the rate the decode
    saw."""
    bracket = [os.path.join(d, f"bandwidth-{r}-{f}-{w}.json") for w in ("before", "after")]
    if all(os.path.exists(p) for p in bracket):
        return sum(json.load(open(p))["bandwidth_gb_s"] for p in bracket) / 2 * 1e9
    return json.load(open(os.path.join(d, f"bandwidth-{r}.json")))["bandwidth_gb_s"] * 1e9

def vigil(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            # `--floor`'s matmul replay and read by job are shares, not tokens per second.
            if "tokens_per_s_median" in j:
                out[j["test"]] = (j["tokens_per_s_median"], j["tokens_per_s_min"], j["tokens_per_s_max"])
    return out

def read_share(path):
    """bench_core --floor's tg128-floor line: decode's share of a plain read of the bytes it
    reads, alternated token by token (median, min, max %, and the read's median GB/s), or None."""
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("test") == "tg128-floor":
                return (j["floor_share_pct_median"], j["floor_share_pct_min"], j["floor_share_pct_max"], j["read_gb_s_median"])
    return None

def dispatch_shares(path):
    """bench_core --floor's tg128-matmuls and tg128-read-by-job lines: the step's matmuls
    replayed alone, and the plain read cut at the step's dispatches, each as a share of the plain
    read in one dispatch (medians, %), or None where the run has neither."""
    got = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("test") in ("tg128-matmuls", "tg128-read-by-job"):
                got[j["test"]] = j["floor_share_pct_median"]
    if len(got) < 2:
        return None
    return got["tg128-matmuls"], got["tg128-read-by-job"]

def llama(path):
    out = {}
    try:
        rows = json.load(open(path))
    except Exception:
        return out
    for r in rows:
        if r["n_prompt"] and not r["n_gen"]: name = f"pp{r['n_prompt']}"
        elif r["n_depth"]: name = f"tg{r['n_gen']}@d{r['n_depth']}"
        else: name = f"tg{r['n_gen']}"
        out[name] = (r["avg_ts"], r["stddev_ts"])
    return out

def main():
    d = sys.argv[1]
    files = {"q4_0": sys.argv[2] if len(sys.argv) > 2 else "/tmp/smol-q4_0.gguf",
             "q4_1": ".cache/SmolLM2-135M-Instruct.Q4_1.gguf"}
    print(open(os.path.join(d, "cpu.txt")).readline().strip())
    print()
    print("| file | round | figure | Vigil median (min–max) | llama.cpp mean ± sd | ratio | floor | Vigil at | share of a read of its own bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f, path in files.items():
        wbytes, kv = bytes_per_token(path)
        for r in (1, 2):
            bw = round_bandwidth(d, r, f)
            v = vigil(os.path.join(d, f"vigil-{f}-{r}.jsonl"))
            share = read_share(os.path.join(d, f"vigil-{f}-{r}.jsonl"))
            l = llama(os.path.join(d, f"llama-{f}-fa1-{r}.json"))
            l0 = llama(os.path.join(d, f"llama-{f}-d2048-fa0-{r}.json"))
            l1 = llama(os.path.join(d, f"llama-{f}-d2048-fa1-{r}.json"))
            for name in ("pp512", "pp2048", "tg128", "tg64@d2048"):
                if name not in v: continue
                vm, vmin, vmax = v[name]
                if name == "tg64@d2048":
                    cands = [(x[name], fa) for x, fa in ((l0, "fa off"), (l1, "fa on")) if name in x]
                    best = max(cands, default=None, key=lambda c: c[0][0])
                    lv, note = (best[0], f" ({best[1]}; other {', '.join(f'{c[0][0]:.1f} {c[1]}' for c in cands if c is not best)})") if best else (None, "")
                    floor = bw / (wbytes + kv)
                else:
                    lv, note = l.get(name), ""
                    floor = bw / wbytes if name == "tg128" else None
                ls = f"{lv[0]:.1f} ± {lv[1]:.1f}{note}" if lv else "–"
                ratio = f"{vm / lv[0]:.2f}× ({vm:.1f} / {lv[0]:.1f})" if lv else "–"
                fl = f"{floor:.1f} tok/s ({bw / 1e9:.1f} GB/s)" if floor else ""
                at = f"{100 * vm / floor:.0f} %" if floor else ""
                rs = f"{share[0]:.0f} % ({share[1]:.0f}–{share[2]:.0f}; read {share[3]:.1f} GB/s)" if share and name == "tg128" else ""
                print(f"| {f.upper()} | {r} | {name} | {vm:.1f} ({vmin:.1f}–{vmax:.1f}) | {ls} | {ratio} | {fl} | {at} | {rs} |")

if __name__ == "__main__":
    main()
