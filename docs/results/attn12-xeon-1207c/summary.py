#!/usr/bin/env python3
"""Per model and test: Vigil before/after (tok/s per round) and llama-bench, with the ratios.
Usage: python3 docs/results/attn12-xeon-1207c/summary.py > docs/results/attn12-xeon-1207c/summary.txt"""
import glob, json, os, re

D = os.path.dirname(os.path.abspath(__file__))
rows = {}
for f in sorted(glob.glob(f"{D}/*-[0-9].jsonl")):
    b, model, r = re.match(r".*/(base|new)-(.+)-(\d)\.jsonl", f).groups()
    for line in open(f):
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if "tokens_per_s_median" in j:
            rows.setdefault((model, j["test"]), {}).setdefault(b, []).append(j["tokens_per_s_median"])
for f in sorted(glob.glob(f"{D}/llama-*-[0-9].json")):
    model = re.match(r".*/llama-(.+)-\d\.json", f).group(1)
    try:
        runs = json.load(open(f))
    except json.JSONDecodeError:
        continue
    for t in runs:
        if t["n_gen"] == 0:
            rows.setdefault((model, f"pp{t['n_prompt']}"), {}).setdefault("llama", []).append(t["avg_ts"])
for (model, test), v in sorted(rows.items()):
    fmt = lambda xs: " · ".join(f"{x:.1f}" for x in xs)
    line = f"{model:14} {test:7} before {fmt(v.get('base', []))} | after {fmt(v.get('new', []))} | llama-bench {fmt(v.get('llama', []))}"
    if v.get("llama"):
        for b in ("base", "new"):
            line += f" | {b}/llama " + " · ".join(f"×{x / l:.2f}" for x, l in zip(v.get(b, []), v["llama"]))
    if v.get("base") and v.get("new"):
        line += " | after/before " + " · ".join(f"×{n / b:.3f}" for n, b in zip(v["new"], v["base"]))
    print(line)
