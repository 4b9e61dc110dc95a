"""`scripts/check_cpu_bars.py`, the table that says which CPU-speed bars a benchmark run holds:
run on committed result folders (the last Zen 3 runs) and on a made-up run whose figures sit
on and just past each bar's edge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
Q4_1 = Path(os.environ.get("VIGIL_TEST_GGUF", REPO / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def tables(*args: str) -> list[list[str]]:
    """The cells of every table row the script prints."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_cpu_bars.py"), *args],
        check=True, capture_output=True, text=True, cwd=REPO,
    ).stdout
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines() if line.startswith("|")]


def bars(*args: str) -> dict[str, tuple[str, str]]:
    """figure -> (each round, holds) from the script's table of bars."""
    return {c[0]: (c[2], c[3]) for c in tables(*args) if len(c) == 4 and c[0] not in ("figure", "---")}


def read_shares(*args: str) -> dict[str, str]:
    """figure -> each round, from the table of decode's share of a read of its own bytes."""
    return {c[0]: c[1] for c in tables(*args) if len(c) == 2 and c[1] not in ("each round", "---")}


def test_zen3_runs_on_record():
    rows = bars("--serving", str(RESULTS / "serving-zen3-1204h"), "--qwen3", str(RESULTS / "qwen3-shape-zen3-1204"))
    assert rows["serving output tok/s at 8 streams vs llama-server -np 8"] == ("×2.90", "no")
    assert rows["serving p50 TTFT at 8 streams vs llama-server"] == ("×0.15", "**yes**")
    assert rows["serving output tok/s at 8 streams vs vLLM's CPU build"] == ("–", "no figure")
    assert rows["Qwen3-0.6B shape BF16 pp512 vs llama-bench"] == ("×1.45 · ×1.24", "no")
    assert rows["Qwen3-0.6B shape Q8_0 pp512 vs llama-bench"] == ("×2.00 · ×1.57", "**yes**")


def llama_row(n_prompt: int, n_gen: int, n_depth: int, tok_s: float) -> dict:
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "avg_ts": tok_s, "stddev_ts": 0.0}


@pytest.mark.parametrize("readings", ["round", "bracket"])
def test_bar_edges(tmp_path: Path, readings: str):
    """One round of Q4_0 numbers at each bar's edge: a ratio of exactly 2 holds, 1.99 does not;
    decode at 90 % of its floor holds, after 2,048 tokens 74 % does not. Q4_1 has no run.
    `bracket`: the run also read the bandwidth just before and after Vigil's run (10 and 30
    GB/s, mean 20), and the floors take those over the round's reading (40 GB/s)."""
    assert Q4_1.is_file(), f"the test model is missing: {Q4_1} (scripts/fetch_test_assets.sh)"
    sys.path.insert(0, str(REPO / "scripts"))
    from summarize_decode_bench import gguf_layout

    wbytes, meta = gguf_layout(str(Q4_1))
    layers, heads = meta["llama.block_count"], meta["llama.attention.head_count"]
    kv_dim = meta["llama.attention.head_count_kv"] * meta["llama.embedding_length"] // heads
    bw = 20.0e9
    floor, depth_floor = bw / wbytes, bw / (wbytes + layers * 2 * kv_dim * 2 * (2048 + 32))
    (tmp_path / "cpu.txt").write_text("model name\t: Test CPU\nflags\t: avx2\n")
    if readings == "round":
        (tmp_path / "bandwidth-1.json").write_text(json.dumps({"bandwidth_gb_s": bw / 1e9}))
    else:
        (tmp_path / "bandwidth-1.json").write_text(json.dumps({"bandwidth_gb_s": 2 * bw / 1e9}))
        for when, gb_s in (("before", 0.5 * bw / 1e9), ("after", 1.5 * bw / 1e9)):
            (tmp_path / f"bandwidth-1-q4_0-{when}.json").write_text(json.dumps({"bandwidth_gb_s": gb_s}))
    figures = {"pp512": 2000.0, "pp2048": 995.0, "tg128": 0.9 * floor * 1.0001, "tg64@d2048": 0.74 * depth_floor}
    # bench_core --floor's line: decode alternated with a read of its own bytes.
    share = {"test": "tg128-floor", "tokens_per_s_median": 1.0, "tokens_per_s_min": 1.0, "tokens_per_s_max": 1.0,
             "floor_share_pct_median": 87.4, "floor_share_pct_min": 86.0, "floor_share_pct_max": 88.0,
             "read_gb_s_median": 31.25}
    # And its matmuls replayed alone and the read cut at the step's dispatches: shares, with no
    # tokens/s (the summarizer must skip them as figures).
    dispatches = [
        {"test": "tg128-matmuls", "floor_share_pct_median": 80.2, "floor_share_pct_min": 79.0,
         "floor_share_pct_max": 81.0, "steps_per_s_median": 1.0, "steps_per_s_min": 1.0, "steps_per_s_max": 1.0},
        {"test": "tg128-read-by-job", "floor_share_pct_median": 95.0, "floor_share_pct_min": 94.0,
         "floor_share_pct_max": 96.0},
    ]
    (tmp_path / "vigil-q4_0-1.jsonl").write_text("".join(
        json.dumps({"test": t, "tokens_per_s_median": v, "tokens_per_s_min": v, "tokens_per_s_max": v}) + "\n"
        for t, v in figures.items()
    ) + "".join(json.dumps(j) + "\n" for j in [share, *dispatches]))
    tg_peer = figures["tg128"] / 1.5001
    (tmp_path / "llama-q4_0-fa1-1.json").write_text(json.dumps(
        [llama_row(512, 0, 0, 1000.0), llama_row(2048, 0, 0, 500.0), llama_row(0, 128, 0, tg_peer)]
    ))
    # The file named as Q4_0 only lends its weight bytes: any GGUF does.
    rows = bars("--core", str(tmp_path), "--q4_0", str(Q4_1))
    assert rows["SmolLM2 Q4_0 pp512 vs llama-bench"] == ("×2.00", "**yes**")
    assert rows["SmolLM2 Q4_0 pp2048 vs llama-bench"] == ("×1.99", "no")
    assert rows["SmolLM2 Q4_0 tg128 vs llama-bench"] == ("×1.50", "**yes**")
    assert rows["SmolLM2 Q4_0 tg128, share of its weight-read floor"] == ("90 %", "**yes**")
    assert rows["SmolLM2 Q4_0 decode after 2,048 tokens, share of its weights + KV floor"] == ("74 %", "no")
    assert rows["SmolLM2 Q4_1 pp512 vs llama-bench"] == ("–", "no figure")
    # Reported beside the bars, not counted among them; Q4_1 has no run, so no row.
    # 87.4 % of the read in one dispatch is 92 % of the read cut at the dispatches (95.0 %).
    assert read_shares("--core", str(tmp_path), "--q4_0", str(Q4_1)) == {
        "SmolLM2 Q4_0": "87 % (read 31.2 GB/s); matmuls alone 80 %, read by job 95 % (decode at 92 % of it)"
    }
