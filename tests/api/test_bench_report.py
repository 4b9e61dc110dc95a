"""`vigil bench report`'s HTML page, opened in headless Chromium: a brief `vigil bench run` of four
cheap workloads with two targets (both the tiny Qwen3 server), then `vigil bench report`, then the
page is loaded through Playwright and checked as the browser rendered it: no console or page
errors, no request beyond the file itself, a table per workload with a row per (point, metric),
and every chart an SVG with a non-zero rendered size whose bars match the result files' p50s.

Chromium: $VIGIL_TEST_CHROMIUM (scripts/setup_chromium.sh installs it and exports it; CI does),
else `chromium` on PATH; without either the module is skipped (and fails under CI=true). Playwright never downloads a
browser here: it drives the system Chromium (`executable_path`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import VigilServer, vigil_bin

# The flags Chromium needs on a machine without network (without them it stalls on lookups).
# Playwright adds a fresh temporary --user-data-dir per launch.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

# Workload → `vigil bench run` sizing flags: two points each, a few tokens, a second or so in all.
RUNS = {
    "single": ["--prompt-tokens=16,32", "--output-tokens=4"],
    "concurrent": ["--concurrency=1,2", "--concurrent-prompt-tokens=16", "--concurrent-output-tokens=4"],
    "prefill": ["--prefill-prompt-tokens=32,64"],
    # T=1 has no later turns: its "TTFT, later turns" row is left out and that chart has one group.
    "agent-loop": ["--prefix-tokens=32", "--turns=1,2", "--turn-tokens=4"],
}
TARGETS = ["a", "b"]


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    aggregate: bool = False  # from the point's `throughput`, not its `metrics` percentiles


# What each workload's table and charts show, in order (the report's `metrics_of`).
METRICS = {
    "single": [
        Metric("ttft_ms", "TTFT", "ms"), Metric("itl_ms", "ms per output token", "ms"),
        Metric("e2e_ms", "end to end", "ms"), Metric("output_tok_s", "output tok/s (per request)", "tok/s"),
    ],
    "concurrent": [
        Metric("output_tok_s", "output tok/s (all streams)", "tok/s", True),
        Metric("requests_per_s", "requests/s", "req/s", True),
        Metric("ttft_ms", "TTFT", "ms"), Metric("itl_ms", "ms per output token", "ms"),
        Metric("e2e_ms", "end to end", "ms"),
    ],
    "prefill": [Metric("prompt_tok_s", "prompt tok/s", "tok/s"), Metric("ttft_ms", "TTFT", "ms")],
    "agent-loop": [
        Metric("loop_ms", "whole loop", "ms"), Metric("ttft_first_turn_ms", "TTFT, first turn", "ms"),
        Metric("ttft_later_turns_ms", "TTFT, later turns", "ms"), Metric("e2e_ms", "end to end", "ms"),
    ],
}
BAR_W = 420.0  # the longest bar of a chart, in SVG units


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary; skips the module when there is none (fails when the set one is gone)."""
    path = os.environ.get("VIGIL_TEST_CHROMIUM")
    if path:
        if not os.access(path, os.X_OK):
            pytest.fail(f"VIGIL_TEST_CHROMIUM={path} is not an executable file", pytrace=False)
        return path
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("no Chromium under CI: scripts/setup_chromium.sh must install it", pytrace=False)
    pytest.skip("no Chromium: run `eval \"$(scripts/setup_chromium.sh)\"` (CI does) or set VIGIL_TEST_CHROMIUM")


def fmt_num(v: float) -> str:
    """The report's number format (`fmt_num` in report/mod.rs)."""
    a = abs(v)
    return f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def bar_fraction(values: list[float], v: float, top: float) -> float:
    """A bar's share of BAR_W (the report's `Scale`): linear, or logarithmic from the decade below
    the smallest positive value when the chart's values span more than a factor of 20."""
    pos = [x for x in values if x > 0]
    if pos and max(pos) / min(pos) > 20:
        floor = 10 ** math.floor(math.log10(min(pos)))
        span = max(math.log10(top / floor), 1.0)
        return min(max(math.log10(v / floor) / span, 0.0), 1.0) if v > 0 else 0.0
    return v / top


MISSING = object()  # the point has no such metric (no row, no bar)


def p50(point: dict, m: Metric):
    """The point's p50 of `m` (a number, or None where the file wrote NaN as null), or MISSING.
    The fixture has checked that no point is excluded, so every present value is charted."""
    if m.aggregate:
        return point["throughput"].get(m.key, MISSING)
    s = point["metrics"].get(m.key)
    return MISSING if s is None else s["p50"]


def finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


@dataclass
class Expected:
    """One workload's table and charts as its result file says they must be."""
    workload: str
    columns: list[str]           # table headings of the targets
    rows: list[tuple[str, str]]  # (point, "title (unit)") per table row
    charts: list[dict]           # per chart: title prefix, group labels, bars (column, width, label)


def expected(run: dict) -> Expected:
    targets = run["targets"]
    labels = [p["label"] for p in targets[0]["points"]]
    by_label = [{p["label"]: p for p in t["points"]} for t in targets]
    # (point, metric) → a value per target; a row exists where any target has one.
    cells = {(label, m): [p50(pts[label], m) if label in pts else MISSING for pts in by_label]
             for label in labels for m in METRICS[run["workload"]]}
    present = {k: v for k, v in cells.items() if any(c is not MISSING for c in v)}
    rows = [(label, f"{m.title} ({m.unit})") for (label, m) in present]  # by point, then metric
    charts = []
    for m in METRICS[run["workload"]]:
        groups = [(label, v) for (label, mm), v in present.items() if mm == m]
        if not groups:
            continue
        charted = [c for _, v in groups for c in v if finite(c)]
        top = max(charted, default=0.0)
        bars = [{"column": i, "width": max(bar_fraction(charted, c, top) * BAR_W, 1.0), "label": fmt_num(c)}
                for _, v in groups for i, c in enumerate(v) if finite(c) and top > 0]
        charts.append({"title": f"{run['workload']} — {m.title} p50 ({m.unit}, ",
                       "groups": [label for label, _ in groups], "bars": bars})
    # A model id that is a path is shown by its last component.
    columns = [f"{t['name']} ({t['model'].rstrip('/').rsplit('/', 1)[-1]})" for t in targets]
    return Expected(run["workload"], columns, rows, charts)


@pytest.fixture(scope="module")
def report(chromium: str, qwen: VigilServer, tmp_path_factory) -> tuple[Path, list[dict]]:
    """Runs every workload of RUNS against `qwen` as targets a and b; returns report.html and the
    parsed result files. (`chromium` first: no browser, no runs.)"""
    out_dir = tmp_path_factory.mktemp("bench-report")
    files = []
    for workload, sizes in RUNS.items():
        cmd = [vigil_bin(), "bench", "run", "--workload", workload, "--out", str(out_dir / "results"),
               "--warmup", "1", "--iterations", "2", "--startup-timeout", "60", *sizes]
        for name in TARGETS:
            cmd += ["--target", f"{name}={qwen.url}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stderr[-4000:]}"
        files.append(Path(out.stdout.strip()))
    out = subprocess.run([vigil_bin(), "bench", "report", *map(str, files), "--out", str(out_dir / "report")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"vigil bench report failed:\n{out.stderr[-4000:]}"
    runs = [json.loads(f.read_text()) for f in files]
    for run in runs:
        for t in run["targets"]:
            for p in t["points"]:
                assert not p["excluded"], f"{run['workload']} {t['name']} {p['label']}: {p['errors']}"
    return out_dir / "report" / "report.html", runs


# Collected in the page: per <h2> section, its tables (header cells, first three cells of each row)
# and its charts (rendered box, title, legend swatches, bars with their rendered boxes).
PAGE_SCRIPT = """() => {
  const box = el => { const r = el.getBoundingClientRect(); return {w: r.width, h: r.height, x: r.x, y: r.y}; };
  const sections = [];
  for (const el of document.body.children) {
    if (el.tagName === 'H2') { sections.push({name: el.textContent, tables: [], charts: []}); continue; }
    const s = sections[sections.length - 1];
    if (!s) continue;
    if (el.tagName === 'TABLE') {
      const trs = [...el.rows];
      s.tables.push({box: box(el), head: [...trs[0].cells].map(c => c.textContent),
                     rows: trs.slice(1).map(r => [...r.cells].slice(0, 3).map(c => c.textContent))});
    } else if (el.namespaceURI === 'http://www.w3.org/2000/svg' && el.tagName === 'svg') {
      const rects = [...el.querySelectorAll('rect')];
      const bar = r => r.getAttribute('y') > 32;  // below the legend row
      s.charts.push({
        box: box(el), isSvg: el instanceof SVGSVGElement,
        width: el.width.baseVal.value, title: el.querySelector('text')?.textContent ?? '',
        groups: [...el.querySelectorAll('text[x="0"]')].slice(1).map(t => t.textContent),
        legend: rects.filter(r => !bar(r)).map(r => ({fill: r.getAttribute('fill'), box: box(r)})),
        bars: rects.filter(bar).map(r => ({
          y: +r.getAttribute('y'), fill: r.getAttribute('fill'), bbox: r.getBBox().width,
          box: box(r), label: r.nextElementSibling?.textContent ?? ''})),
      });
    }
  }
  return {title: document.title, h1: document.querySelector('h1')?.textContent ?? '', sections,
          scripts: document.scripts.length};
}"""


def open_in_chromium(executable: str, html: Path) -> tuple[dict, list[str]]:
    """Loads `html` in headless Chromium; returns what PAGE_SCRIPT saw and every problem the
    browser reported (console errors, uncaught exceptions, failed or outside requests)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        if os.environ.get("VIGIL_TEST_CHROMIUM"):
            raise
        pytest.skip(f"playwright is not installed ({e}): pip install -r tests/api/requirements.txt")
    problems: list[str] = []
    url = html.resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            page = browser.new_page()
            page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
            page.on("request", lambda r: r.url != url and problems.append(f"request beyond the page: {r.url}"))
            response = page.goto(url, wait_until="load", timeout=30_000)
            if response is not None and not response.ok:
                problems.append(f"loading {url}: {response.status}")
            seen = page.evaluate(PAGE_SCRIPT)
        finally:
            browser.close()
    return seen, problems


def check_page(seen: dict, problems: list[str], runs: list[dict]) -> None:
    """Everything the rendered page must show for these result files (raises AssertionError)."""
    assert problems == [], "the browser reported:\n" + "\n".join(problems)
    assert seen["title"] == "Benchmark report" and seen["h1"] == "Benchmark report", seen["title"]
    assert seen["scripts"] == 0, "the report is documented as script-free"
    sections = {s["name"]: s for s in seen["sections"]}
    want = [expected(r) for r in runs]
    assert list(sections) == ["Runs"] + [w for w in METRICS if w in {e.workload for e in want}], list(sections)
    (runs_table,) = sections["Runs"]["tables"]
    assert [r[0] for r in runs_table["rows"]] == [str(i + 1) for i in range(len(runs))]
    assert [r[2] for r in runs_table["rows"]] == [r["workload"] for r in runs]

    for exp in want:
        s = sections[exp.workload]
        assert s["tables"], f"{exp.workload}: no table"
        t = s["tables"][0]
        assert t["box"]["w"] > 0 and t["box"]["h"] > 0, f"{exp.workload}: table not rendered"
        assert t["head"] == ["point", "metric", *exp.columns, "best vs runner-up"], t["head"]
        assert [tuple(r[:2]) for r in t["rows"]] == exp.rows, f"{exp.workload} table rows"
        titles = [c["title"] for c in s["charts"]]
        assert len(titles) == len(exp.charts), f"{exp.workload}: charts {titles}"
        for chart, e in zip(s["charts"], exp.charts):
            name = chart["title"]
            assert name.startswith(e["title"]), f"{exp.workload}: chart {name!r}, want {e['title']!r}…"
            assert chart["isSvg"], f"{name}: not an SVG element"
            assert chart["groups"] == e["groups"], f"{name}: groups {chart['groups']}"
            assert chart["box"]["w"] >= chart["width"] > 0 and chart["box"]["h"] > 0, f"{name}: {chart['box']}"
            fills = [g["fill"] for g in chart["legend"]]
            assert len(fills) == len(exp.columns) and len(set(fills)) == len(fills), f"{name}: legend {fills}"
            assert len(chart["bars"]) == len(e["bars"]), f"{name}: {len(chart['bars'])} bars, want {len(e['bars'])}"
            for bar, b in zip(chart["bars"], e["bars"]):
                assert bar["fill"] == fills[b["column"]], f"{name}: bar colour {bar}"
                assert abs(bar["bbox"] - b["width"]) <= 0.06, f"{name}: bar {bar} for {b}"
                assert bar["box"]["w"] > 0 and bar["box"]["h"] > 0, f"{name}: bar not rendered {bar}"
                inside = chart["box"]["x"] <= bar["box"]["x"] and \
                    bar["box"]["x"] + bar["box"]["w"] <= chart["box"]["x"] + chart["box"]["w"] + 0.5
                assert inside, f"{name}: bar outside its chart {bar} in {chart['box']}"
                assert bar["label"] == b["label"], f"{name}: bar label {bar['label']!r}, want {b['label']!r}"
            longest = max((bar["bbox"] for bar in chart["bars"]), default=BAR_W)
            assert abs(longest - BAR_W) <= 0.06, f"{name}: the longest bar is {longest}, not full length"


def test_report_html_renders_in_chromium(chromium, report):
    html, runs = report
    seen, problems = open_in_chromium(chromium, html)
    check_page(seen, problems, runs)
