//! The matrix workload's grid, as the speed-test matrix shows it: per target, rows of context
//! lengths and columns of simultaneous requests, each cell its total output tok/s and TTFT
//! (p50), or the status that kept it from being measured; prefill speed per context beside it.

use super::fmt_num;
use crate::matrix::CellStatus;
use crate::result::{Point, RunFile};
use crate::workload::Workload;
use std::collections::BTreeSet;

/// One target's grid in one matrix run.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// `name (model)`.
    pub heading: String,
    /// Column headings: requests at once.
    pub concurrency: Vec<u64>,
    /// A row per context length: the context and a cell text per column.
    pub rows: Vec<(u64, Vec<String>)>,
    /// Prefill per context: the context and its text.
    pub prefill: Vec<(u64, String)>,
    /// Statuses other than valid that occur, for the notes.
    pub statuses: Vec<CellStatus>,
}

/// A grid per target of every matrix run.
pub fn grids(files: &[RunFile]) -> Vec<Grid> {
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.workload == Workload::Matrix) {
        for t in &f.targets {
            out.push(grid(format!("{} ({})", t.name, t.model), &t.points));
        }
    }
    out
}

fn param(p: &Point, key: &str) -> Option<u64> {
    p.params.get(key).copied()
}

fn status(p: &Point) -> Option<CellStatus> {
    p.status.as_deref().and_then(CellStatus::parse)
}

fn grid(heading: String, points: &[Point]) -> Grid {
    let is_decode = |p: &&Point| p.params.contains_key("duration_s");
    let decode: Vec<&Point> = points.iter().filter(is_decode).collect();
    let contexts: BTreeSet<u64> = decode.iter().filter_map(|p| param(p, "context")).collect();
    let levels: BTreeSet<u64> = decode
        .iter()
        .filter_map(|p| param(p, "concurrency"))
        .collect();
    let rows = contexts
        .iter()
        .map(|&ctx| {
            let cells = levels.iter().map(|&n| {
                decode
                    .iter()
                    .find(|p| {
                        param(p, "context") == Some(ctx) && param(p, "concurrency") == Some(n)
                    })
                    .map_or("–".to_string(), |p| {
                        cell_text(p, "tok/s", "output_tok_s", false)
                    })
            });
            (ctx, cells.collect())
        })
        .collect();
    let prefill = (points.iter())
        .filter(|p| !is_decode(p))
        .filter_map(|p| {
            Some((
                param(p, "context")?,
                cell_text(p, "prompt tok/s", "prompt_tok_s", true),
            ))
        })
        .collect();
    let statuses: BTreeSet<CellStatus> = (points.iter())
        .filter_map(status)
        .filter(|&s| s != CellStatus::Valid)
        .collect();
    Grid {
        heading,
        concurrency: levels.into_iter().collect(),
        rows,
        prefill,
        statuses: statuses.into_iter().collect(),
    }
}

/// `1234.5 tok/s · 12.3 ms TTFT`, with `requests queued` where it was; a status for a cell
/// without numbers. `percentile`: the speed is a p50 of `metrics`, else a `throughput` total.
fn cell_text(p: &Point, unit: &str, key: &str, percentile: bool) -> String {
    let st = status(p);
    if let Some(s) = st.filter(|s| s.skipped()) {
        return s.label().to_string();
    }
    if p.excluded {
        return format!("excluded ({} failed)", p.failed);
    }
    let speed = if percentile {
        p.metrics.get(key).map(|s| s.p50)
    } else {
        p.throughput.get(key).copied()
    };
    let ttft = p.metrics.get("ttft_ms").map(|s| s.p50);
    let mut text = format!(
        "{} {unit} · {} ms TTFT",
        speed.map_or("–".into(), fmt_num),
        ttft.map_or("–".into(), fmt_num)
    );
    if st == Some(CellStatus::RequestsQueued) {
        text.push_str(" (requests queued)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Summary;
    use std::collections::BTreeMap;

    fn point(context: u64, concurrency: Option<u64>, status: CellStatus) -> Point {
        let mut params = BTreeMap::from([("context".to_string(), context)]);
        if let Some(n) = concurrency {
            params.insert("concurrency".into(), n);
            params.insert("duration_s".into(), 30);
        }
        let measured = !status.skipped();
        let summary = |v: f64| Summary::of([v]).unwrap();
        Point {
            label: String::new(),
            params,
            warmup_requests: 0,
            measured_requests: u32::from(measured),
            failed: u32::from(status == CellStatus::Failed),
            excluded: status == CellStatus::Failed,
            errors: vec![],
            wall_s: 30.0,
            throughput: if measured {
                BTreeMap::from([("output_tok_s".to_string(), 450.0)])
            } else {
                BTreeMap::new()
            },
            metrics: if measured {
                BTreeMap::from([
                    ("ttft_ms".to_string(), summary(86.0)),
                    ("prompt_tok_s".to_string(), summary(37_100.0)),
                ])
            } else {
                BTreeMap::new()
            },
            samples: vec![],
            status: Some(status.label().to_string()),
        }
    }

    #[test]
    fn grid_rows_are_contexts_and_columns_concurrency() {
        use CellStatus::*;
        let points = [
            point(8192, None, Valid),
            point(16384, None, OverCapacity),
            point(8192, Some(1), Valid),
            point(8192, Some(32), RequestsQueued),
            point(16384, Some(1), Failed),
            point(16384, Some(32), NotRun),
        ];
        let g = grid("vigil (m)".into(), &points);
        assert_eq!(g.concurrency, [1, 32]);
        assert_eq!(g.rows[0].0, 8192);
        assert_eq!(
            g.rows[0].1,
            [
                "450.0 tok/s · 86.00 ms TTFT",
                "450.0 tok/s · 86.00 ms TTFT (requests queued)"
            ]
        );
        assert_eq!(g.rows[1].1, ["excluded (1 failed)", "not run"]);
        assert_eq!(
            g.prefill,
            [
                (8192, "37100.0 prompt tok/s · 86.00 ms TTFT".to_string()),
                (16384, "over capacity".to_string())
            ]
        );
        assert_eq!(g.statuses, [RequestsQueued, OverCapacity, NotRun, Failed]);
    }
}
