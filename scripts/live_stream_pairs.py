#!/usr/bin/env python3
"""The sessions bar of a `vigil bench run --workload live-stream` result: each cold query on
Vigil's session against the uncached replays that re-sent its very window (same held tokens),
pair by pair, for Vigil's own replay and every peer's. Prints, per result file, the Flash
Query p50/p99 and hits, the cold query's e2e/TTFT/ITL p50, and per replaying target the
ratio (replay e2e / cold e2e) at held >= 1,792 tokens (the bar's 2,048), at the largest held
size, and over all. Stdlib only.

Usage: scripts/live_stream_pairs.py RESULT.json..."""
import json, statistics as st, sys


def main():
    for path in sys.argv[1:]:
        d = json.load(open(path))
        pts = {(t["name"], p["label"]): [s for s in p["samples"] if not s.get("warmup") and not s.get("error")]
               for t in d["targets"] for p in t["points"]}
        flash, cold = pts[("vigil", "flash query")], pts[("vigil", "cold query")]
        fe = sorted(s["e2e_ms"] for s in flash)
        print(f"{path}\n  flash p50 {st.median(fe):.2f} ms, p99 {fe[int(0.99 * (len(fe) - 1))]:.2f} ms, {len(fe)} answered")
        print(f"  cold e2e p50 {st.median(s['e2e_ms'] for s in cold):.1f} ms ({min(s['e2e_ms'] for s in cold):.1f}–"
              f"{max(s['e2e_ms'] for s in cold):.1f}), TTFT p50 {st.median(s['ttft_ms'] for s in cold):.1f}, "
              f"ITL p50 {st.median(s['itl_ms'] for s in cold):.2f}")
        top = max(s["held_tokens"] for s in cold)
        for (name, label), reps in sorted(pts.items()):
            if label != "stateless replay, uncached":
                continue
            if [c["held_tokens"] for c in cold] != [r["held_tokens"] for r in reps]:
                print(f"  vs {name}: the replays did not re-send the cold queries' windows; no pairs")
                continue
            ratios = [(r["e2e_ms"] / c["e2e_ms"], c["held_tokens"]) for c, r in zip(cold, reps)]
            hi = [x for x, h in ratios if h >= 1792]
            at = ", ".join(f"×{x:.1f}" for x, h in ratios if h == top)
            allr = [x for x, _ in ratios]
            line = f"  vs {name}'s uncached replay:"
            if hi:
                line += f" held >= 1,792 ({len(hi)} pairs) ×{st.median(hi):.1f} ({min(hi):.1f}–{max(hi):.1f});"
            print(f"{line} at {top} held {at}; all ×{st.median(allr):.1f} ({min(allr):.1f}–{max(allr):.1f})")


if __name__ == "__main__":
    main()
