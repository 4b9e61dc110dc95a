#!/usr/bin/env python3
"""Median (min–max) across `vigil bench` result files of one point: each file is one run.

Usage: scripts/summarize_runs.py LABEL FILE... → one JSON line per target with, for the point
labelled LABEL, the median/min/max over runs of its aggregate output tok/s and of its p50 TTFT.
"""
import json
import statistics
import sys


def main():
    label, files = sys.argv[1], sys.argv[2:]
    runs = {}
    for f in files:
        for t in json.load(open(f))["targets"]:
            p = next(p for p in t["points"] if p["label"] == label)
            if p["excluded"]:
                continue
            runs.setdefault(t["name"], []).append(
                (p["throughput"]["output_tok_s"], p["metrics"]["ttft_ms"]["p50"])
            )
    for name, values in runs.items():
        out = {"target": name, "point": label, "runs": len(values)}
        for i, key in enumerate(["output_tok_s", "ttft_p50_ms"]):
            v = [x[i] for x in values]
            out[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
