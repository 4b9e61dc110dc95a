"""`scripts/live_stream_pairs.py`, the per-pair reading of the sessions bar, on a live-stream
result on record: it must give the figures `docs/benchmarks.md` quotes for that run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pairs_of_a_run_on_record():
    run = REPO / "docs" / "results" / "sessions-xeon-1203b" / "live-stream-2048-32cold-b.json"
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "live_stream_pairs.py"), str(run)],
        check=True, capture_output=True, text=True,
    ).stdout
    assert "flash p50 0.22 ms, p99 0.56 ms, 20 answered" in out
    assert "cold e2e p50 147.2 ms (121.8–620.1), TTFT p50 32.5, ITL p50 7.64" in out
    assert "vs vigil's uncached replay: held >= 1,792 (8 pairs) ×10.7 (9.7–11.8); at 2046 held ×11.2, ×10.6" in out
    assert "vs llama-server's uncached replay: held >= 1,792 (8 pairs) ×25.1 (22.5–27.8); at 2046 held ×25.9, ×24.9" in out
