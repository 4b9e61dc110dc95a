//! `vigil bench report`: result files → `report.md` and a self-contained `report.html`.
//!
//! One table per workload, engines side by side: p50 large, p95/p99 beneath, the best value of
//! each row marked whichever engine produced it, and a ratio naming both values it came from.
//! Excluded points (any failed request) are shown as such and never ranked or charted, nor are
//! matrix cells with nothing measured (over capacity, not run, no token in time).

mod html;
mod markdown;
mod matrix;

use crate::matrix::CellStatus;
use crate::result::{Point, RunFile};
use crate::workload::{LiveMode, Workload};
use crate::BenchError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How one metric reads in a report.
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    pub key: &'static str,
    pub title: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    /// From `Point::throughput` (one aggregate) rather than `Point::metrics` (percentiles).
    pub aggregate: bool,
}

const fn spec(
    key: &'static str,
    title: &'static str,
    unit: &'static str,
    higher_is_better: bool,
    aggregate: bool,
) -> MetricSpec {
    MetricSpec {
        key,
        title,
        unit,
        higher_is_better,
        aggregate,
    }
}

const TTFT: MetricSpec = spec("ttft_ms", "TTFT", "ms", false, false);
const ITL: MetricSpec = spec("itl_ms", "ms per output token", "ms", false, false);
const E2E: MetricSpec = spec("e2e_ms", "end to end", "ms", false, false);

/// The metrics each workload's table shows, in order.
pub fn metrics_of(workload: Workload) -> Vec<MetricSpec> {
    match workload {
        Workload::Single => vec![
            TTFT,
            ITL,
            E2E,
            spec(
                "output_tok_s",
                "output tok/s (per request)",
                "tok/s",
                true,
                false,
            ),
        ],
        Workload::Concurrent => vec![
            spec(
                "output_tok_s",
                "output tok/s (all streams)",
                "tok/s",
                true,
                true,
            ),
            spec("requests_per_s", "requests/s", "req/s", true, true),
            TTFT,
            ITL,
            E2E,
        ],
        Workload::Prefill => vec![
            spec("prompt_tok_s", "prompt tok/s", "tok/s", true, false),
            TTFT,
        ],
        Workload::AgentLoop | Workload::ToolLoop => vec![
            spec("loop_ms", "whole loop", "ms", false, false),
            spec("ttft_first_turn_ms", "TTFT, first turn", "ms", false, false),
            spec(
                "ttft_later_turns_ms",
                "TTFT, later turns",
                "ms",
                false,
                false,
            ),
            E2E,
        ],
        Workload::Sustained | Workload::Burst => vec![
            spec(
                "output_tok_s",
                "output tok/s (all workflows)",
                "tok/s",
                true,
                true,
            ),
            spec(
                "workflows_finished",
                "workflows finished",
                "count",
                true,
                true,
            ),
            TTFT,
            spec(
                "generation_tok_s",
                "generation speed per request",
                "tok/s",
                true,
                false,
            ),
            E2E,
            spec(
                "prefill_share",
                "share of engine time in prefill",
                "fraction",
                false,
                true,
            ),
            spec(
                "prefill_tokens_per_step",
                "prompt tokens per prefill step",
                "tokens",
                true,
                true,
            ),
        ],
        Workload::LiveStream => vec![
            E2E,
            TTFT,
            spec("flash_hit_rate", "flash hits", "fraction", true, true),
            spec(
                "mean_lag",
                "mean lag of flash answers",
                "versions",
                false,
                true,
            ),
            spec("late_queries", "queries sent late", "count", false, true),
        ],
        Workload::Matrix => vec![
            spec(
                "output_tok_s",
                "total output tok/s (all requests)",
                "tok/s",
                true,
                true,
            ),
            spec(
                "generation_tok_s",
                "output tok/s per request",
                "tok/s",
                true,
                false,
            ),
            TTFT,
            ITL,
            spec("prompt_tok_s", "prompt tok/s", "tok/s", true, false),
        ],
    }
}

/// One engine's value of one metric at one point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cell {
    Value {
        p50: f64,
        p95: Option<f64>,
        p99: Option<f64>,
    },
    Excluded {
        failed: u32,
    },
    /// A matrix cell with nothing measured (over capacity, not run, no token in time): shown as its status.
    Skipped {
        status: CellStatus,
    },
    Missing,
}

impl Cell {
    fn of(point: Option<&Point>, m: &MetricSpec) -> Cell {
        let Some(p) = point else { return Cell::Missing };
        let status = p.status.as_deref().and_then(CellStatus::parse);
        if let Some(status) = status.filter(|s| s.skipped()) {
            return Cell::Skipped { status };
        }
        if p.excluded {
            return Cell::Excluded { failed: p.failed };
        }
        if m.aggregate {
            return p
                .throughput
                .get(m.key)
                .map_or(Cell::Missing, |&v| Cell::Value {
                    p50: v,
                    p95: None,
                    p99: None,
                });
        }
        p.metrics.get(m.key).map_or(Cell::Missing, |s| Cell::Value {
            p50: s.p50,
            p95: Some(s.p95),
            p99: Some(s.p99),
        })
    }

    pub fn p50(&self) -> Option<f64> {
        match self {
            Cell::Value { p50, .. } if p50.is_finite() => Some(*p50),
            _ => None,
        }
    }
}

/// One column: a target of some run (name and model, never merged across models).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub model: String,
    pub engine: Option<String>,
}

impl Column {
    /// The target's name, and its model as the server names it (a file name without its
    /// directories).
    pub fn heading(&self) -> String {
        format!("{} ({})", self.name, short_model(&self.model))
    }
}

/// A model id as a label: the last component when it is a path.
pub fn short_model(model: &str) -> &str {
    model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(model)
}

/// The SIMD features among `/proc/cpuinfo` flags that decide which kernels run.
pub fn simd_flags(flags: &str) -> String {
    const SIMD: [&str; 16] = [
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx_vnni",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "asimd",
        "sve",
    ];
    let have: Vec<&str> = flags.split_whitespace().collect();
    let shown: Vec<&str> = SIMD.into_iter().filter(|f| have.contains(f)).collect();
    if shown.is_empty() {
        "no AVX".to_string()
    } else {
        shown.join(" ")
    }
}

/// How a run's hardware reads in the Runs table: CPU model, cores and its SIMD flags.
pub fn hardware_label(h: &crate::hardware::Hardware) -> String {
    format!(
        "{} ({} cores; flags: {})",
        h.cpu_model.as_deref().unwrap_or("unknown CPU"),
        h.cores,
        h.cpu_flags
            .as_deref()
            .map_or("not recorded".to_string(), simd_flags)
    )
}

/// A row: one metric at one point, a cell per column, the best column and the ratio.
#[derive(Debug, Clone)]
pub struct Row {
    pub point: String,
    pub metric: MetricSpec,
    pub cells: Vec<Cell>,
    pub best: Option<usize>,
    /// "A ×1.85 vs B (12.3 vs 22.8 ms)": the best against the runner-up.
    pub ratio: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Table {
    pub workload: Workload,
    pub columns: Vec<Column>,
    pub points: Vec<String>,
    pub rows: Vec<Row>,
    /// Excluded points with their first error, per column.
    pub notes: Vec<String>,
}

/// Result files grouped into one table per workload. A target (name and model) that appears in
/// one file is one column; one that appears in several files gets a column per run, named
/// "NAME · run N" (N: the file's place among the inputs, as the Runs table numbers them), so no
/// run hides another.
pub fn tables(files: &[RunFile]) -> Vec<Table> {
    // Per workload: columns, point labels in first-seen order, and (column, label) → point.
    type Gathered = (Vec<Column>, Vec<String>, BTreeMap<(usize, String), Point>);
    let mut runs_of: BTreeMap<(Workload, &str, &str), usize> = BTreeMap::new();
    for f in files {
        for t in &f.targets {
            *runs_of
                .entry((f.workload, t.name.as_str(), t.model.as_str()))
                .or_default() += 1;
        }
    }
    let mut by_workload: BTreeMap<Workload, Gathered> = BTreeMap::new();
    for (run, f) in files.iter().enumerate() {
        let (columns, points, data) = by_workload.entry(f.workload).or_default();
        for t in &f.targets {
            let name = if runs_of[&(f.workload, t.name.as_str(), t.model.as_str())] > 1 {
                format!("{} · run {}", t.name, run + 1)
            } else {
                t.name.clone()
            };
            let col = match columns
                .iter()
                .position(|c| c.name == name && c.model == t.model)
            {
                Some(i) => i,
                None => {
                    columns.push(Column {
                        name,
                        model: t.model.clone(),
                        engine: t.owned_by.clone(),
                    });
                    columns.len() - 1
                }
            };
            for p in &t.points {
                if !points.contains(&p.label) {
                    points.push(p.label.clone());
                }
                data.insert((col, p.label.clone()), p.clone());
            }
        }
    }
    by_workload
        .into_iter()
        .map(|(workload, (columns, points, data))| {
            let mut rows = Vec::new();
            for point in &points {
                for m in metrics_of(workload) {
                    let cells: Vec<Cell> = (0..columns.len())
                        .map(|c| Cell::of(data.get(&(c, point.clone())), &m))
                        .collect();
                    if cells
                        .iter()
                        .all(|c| matches!(c, Cell::Missing | Cell::Skipped { .. }))
                    {
                        // A metric the point cannot have (TTFT of a flash answer), or a matrix
                        // cell no target ran.
                        continue;
                    }
                    let (best, ratio) = rank(&columns, &cells, &m);
                    rows.push(Row {
                        point: point.clone(),
                        metric: m,
                        cells,
                        best,
                        ratio,
                    });
                }
            }
            let notes = data
                .iter()
                .filter(|(_, p)| p.excluded)
                .map(|((c, label), p)| {
                    format!(
                        "{} at {label}: excluded, {} failed request(s){}",
                        columns[*c].name,
                        p.failed,
                        p.errors.first().map_or(String::new(), |e| format!(": {e}"))
                    )
                })
                .collect();
            Table {
                workload,
                columns,
                points,
                rows,
                notes,
            }
        })
        .collect()
}

/// live-stream: every target's stateless replay (cached, then uncached) against each session
/// target's flash and cold query (end to end, p50): the heading, then one row per replaying
/// target and kind.
pub fn live_ratios(t: &Table) -> Option<(Vec<String>, Vec<Vec<String>>)> {
    if t.workload != Workload::LiveStream {
        return None;
    }
    let p50s = |point: &str| -> Vec<Option<f64>> {
        t.rows
            .iter()
            .find(|r| r.point == point && r.metric.key == E2E.key)
            .map_or(vec![None; t.columns.len()], |r| {
                r.cells.iter().map(Cell::p50).collect()
            })
    };
    let (flash, cold, replay) = (
        p50s(LiveMode::Flash.label()),
        p50s(LiveMode::Cold.label()),
        p50s(LiveMode::Replay.label()),
    );
    let mut heads = vec!["stateless replay, e2e p50".to_string()];
    let mut against = Vec::new();
    for (i, c) in t.columns.iter().enumerate() {
        for (what, v) in [("flash", flash[i]), ("cold", cold[i])] {
            if let Some(v) = v.filter(|&v| v > 0.0) {
                heads.push(format!("÷ {} {what} ({} ms)", c.name, fmt_num(v)));
                against.push(v);
            }
        }
    }
    let uncached = p50s(LiveMode::ReplayUncached.label());
    let replays = [("", &replay), (", uncached", &uncached)];
    let rows: Vec<Vec<String>> = replays
        .iter()
        .flat_map(|(tag, p50)| {
            t.columns
                .iter()
                .zip(p50.iter())
                .filter_map(move |(c, r)| Some((c, tag, (*r)?)))
        })
        .map(|(c, tag, r)| {
            let mut row = vec![format!("{}{tag} {} ms", c.name, fmt_num(r))];
            row.extend(against.iter().map(|&v| format!("×{}", fmt_num(r / v))));
            row
        })
        .collect();
    (!against.is_empty() && !rows.is_empty()).then_some((heads, rows))
}

/// The best column, and the ratio of the best to the runner-up naming both values.
fn rank(columns: &[Column], cells: &[Cell], m: &MetricSpec) -> (Option<usize>, Option<String>) {
    let mut valid: Vec<(usize, f64)> = cells
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((i, c.p50()?)))
        .collect();
    valid.sort_by(|a, b| {
        if m.higher_is_better {
            b.1.total_cmp(&a.1)
        } else {
            a.1.total_cmp(&b.1)
        }
    });
    // Values that print the same are a tie: no best, and the ratio says so.
    if let [(a, av), (b, bv), ..] = valid.as_slice() {
        if fmt_num(*av) == fmt_num(*bv) {
            let tie = format!(
                "tie: {} and {} ({} {})",
                columns[*a].name,
                columns[*b].name,
                fmt_num(*av),
                m.unit
            );
            return (None, Some(tie));
        }
    }
    let best = valid.first().map(|&(i, _)| i);
    let ratio = match valid.as_slice() {
        [(b, bv), (r, rv), ..] if *bv > 0.0 && *rv > 0.0 => {
            let x = if m.higher_is_better { bv / rv } else { rv / bv };
            Some(format!(
                "{} ×{x:.2} vs {} ({} vs {} {})",
                columns[*b].name,
                columns[*r].name,
                fmt_num(*bv),
                fmt_num(*rv),
                m.unit
            ))
        }
        _ => None,
    };
    (best, ratio)
}

/// Three significant figures or at least one decimal: 0.123, 12.3, 1234.5.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".to_string();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Reads the result files and writes `report.md` and `report.html` into `out_dir`.
pub fn write_report(inputs: &[PathBuf], out_dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    if inputs.is_empty() {
        return Err(BenchError::Setting("no result files given".into()));
    }
    let files = inputs
        .iter()
        .map(|p| RunFile::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let tables = tables(&files);
    std::fs::create_dir_all(out_dir).map_err(|e| BenchError::io(out_dir, e))?;
    let md_path = out_dir.join("report.md");
    let html_path = out_dir.join("report.html");
    std::fs::write(&md_path, markdown::render(&files, &tables, inputs))
        .map_err(|e| BenchError::io(&md_path, e))?;
    std::fs::write(&html_path, html::render(&files, &tables, inputs))
        .map_err(|e| BenchError::io(&html_path, e))?;
    Ok(vec![md_path, html_path])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str) -> Column {
        Column {
            name: name.into(),
            model: "m".into(),
            engine: None,
        }
    }

    fn v(p50: f64) -> Cell {
        Cell::Value {
            p50,
            p95: Some(p50 + 1.0),
            p99: Some(p50 + 2.0),
        }
    }

    #[test]
    fn ranks_by_direction_and_names_both_values() {
        let cols = [col("a"), col("b"), col("c")];
        let cells = [v(20.0), v(10.0), Cell::Excluded { failed: 1 }];
        let (best, ratio) = rank(&cols, &cells, &TTFT);
        assert_eq!(best, Some(1));
        assert_eq!(ratio.unwrap(), "b ×2.00 vs a (10.00 vs 20.00 ms)");
        let tps = spec("output_tok_s", "t", "tok/s", true, true);
        let (best, ratio) = rank(&cols, &cells, &tps);
        assert_eq!(best, Some(0));
        assert_eq!(ratio.unwrap(), "a ×2.00 vs b (20.00 vs 10.00 tok/s)");
        // An excluded cell is never best, even alone.
        let (best, ratio) = rank(&cols[2..], &cells[2..], &TTFT);
        assert_eq!((best, ratio), (None, None));
        // Values that print the same: no best.
        let (best, ratio) = rank(&cols[..2], &[v(12.301), v(12.299)], &TTFT);
        assert_eq!(best, None);
        assert_eq!(ratio.unwrap(), "tie: b and a (12.30 ms)");
    }

    #[test]
    fn a_target_in_several_runs_gets_a_column_per_run() {
        let file = |p50: f64| -> RunFile {
            let point = serde_json::json!({
                "label": "c=1", "params": {}, "warmup_requests": 0, "measured_requests": 1,
                "failed": 0, "excluded": false, "errors": [], "wall_s": 1.0,
                "throughput": {}, "samples": [],
                "metrics": {"ttft_ms": {"n": 1, "mean": p50, "min": p50, "p50": p50,
                    "p95": p50, "p99": p50, "max": p50}},
            });
            serde_json::from_value(serde_json::json!({
                "schema": "s", "tool_version": "t", "started_unix_s": 0,
                "workload": Workload::Single,
                "settings": crate::workload::Settings::default(),
                "hardware": {"cpu_model": "X", "cores": 2, "logical_cpus": 2, "os": "linux",
                    "arch": "x86_64", "gpu": null, "cpu_flags": "fpu avx2 fma avx512f"},
                "targets": [{"name": "vigil", "url": "u", "model": "/models/a.gguf",
                    "owned_by": null, "server_header": null, "max_model_len": null,
                    "points": [point]}],
            }))
            .unwrap()
        };
        let t = &tables(&[file(5.0), file(7.0)])[0];
        let names: Vec<String> = t.columns.iter().map(Column::heading).collect();
        assert_eq!(names, ["vigil · run 1 (a.gguf)", "vigil · run 2 (a.gguf)"]);
        let ttft = t.rows.iter().find(|r| r.metric.key == "ttft_ms").unwrap();
        assert_eq!(ttft.cells[0].p50(), Some(5.0));
        assert_eq!(ttft.cells[1].p50(), Some(7.0));
        // One run: the plain name.
        assert_eq!(tables(&[file(5.0)])[0].columns[0].name, "vigil");
        assert_eq!(
            hardware_label(&file(5.0).hardware),
            "X (2 cores; flags: avx2 fma avx512f)"
        );
    }

    #[test]
    fn live_ratios_divide_each_replay_by_each_session_answer() {
        let row = |point: &str, cells: Vec<Cell>| Row {
            point: point.into(),
            metric: E2E,
            cells,
            best: None,
            ratio: None,
        };
        let t = Table {
            workload: Workload::LiveStream,
            columns: vec![col("vigil"), col("llamacpp")],
            points: vec![],
            rows: vec![
                row("flash query", vec![v(0.5), Cell::Missing]),
                row("cold query", vec![v(100.0), Cell::Missing]),
                row("stateless replay", vec![v(400.0), v(600.0)]),
                row("stateless replay, uncached", vec![Cell::Missing, v(1200.0)]),
            ],
            notes: vec![],
        };
        let (heads, rows) = live_ratios(&t).unwrap();
        assert_eq!(
            heads,
            [
                "stateless replay, e2e p50",
                "÷ vigil flash (0.500 ms)",
                "÷ vigil cold (100.0 ms)"
            ]
        );
        assert_eq!(rows[0], ["vigil 400.0 ms", "×800.0", "×4.00"]);
        assert_eq!(rows[1], ["llamacpp 600.0 ms", "×1200.0", "×6.00"]);
        assert_eq!(
            rows[2],
            ["llamacpp, uncached 1200.0 ms", "×2400.0", "×12.00"]
        );
        // No session target: nothing to divide by.
        let stateless = Table {
            columns: vec![col("llamacpp")],
            rows: vec![row("stateless replay", vec![v(600.0)])],
            ..t
        };
        assert!(live_ratios(&stateless).is_none());
    }
}
