//! The HTML report: one self-contained page (inline CSS, inline SVG bar charts, no scripts),
//! written as well-formed XHTML so any XML parser can check it.

use super::{fmt_num, Cell, Row, Table};
use crate::result::RunFile;
use std::fmt::Write;
use std::path::PathBuf;

const COLORS: [&str; 6] = [
    "#2f6fb0", "#d0743c", "#4a9b5e", "#9b4a8f", "#b5a33a", "#5a5a5a",
];
const LABEL_W: f64 = 130.0;
const BAR_W: f64 = 420.0;
const BAR_H: f64 = 16.0;
const GROUP_GAP: f64 = 12.0;

pub fn render(files: &[RunFile], tables: &[Table], inputs: &[PathBuf]) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n\
         <meta charset=\"utf-8\"/>\n<title>Benchmark report</title>\n<style>\n\
         body{font-family:system-ui,sans-serif;margin:2em;max-width:80em;color:#222}\n\
         table{border-collapse:collapse;margin:1em 0}\n\
         td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right;vertical-align:top}\n\
         th{background:#f3f3f3}td.l{text-align:left}\n\
         .p50{font-size:1.15em;font-weight:600}.tail{font-size:.8em;color:#666}\n\
         .best{background:#e6f4e6}.excl{color:#a33}\n\
         svg{display:block;margin:.5em 0 1.5em 0}\n</style>\n</head>\n<body>\n\
         <h1>Benchmark report</h1>\n<p>p50 large, p95 · p99 beneath; ★ marks the best value of \
         each row (none on a tie); the ratio compares the best with the runner-up and names both values. Points \
         with any failed request are excluded and never ranked or charted.</p>\n",
    );
    h.push_str("<h2>Runs</h2>\n<table>\n<tr><th>run</th><th>file</th><th>workload</th><th>hardware</th><th>targets</th></tr>\n");
    for (run, (f, path)) in files.iter().zip(inputs).enumerate() {
        let targets: Vec<String> = f
            .targets
            .iter()
            .map(|t| format!("{} = {} at {}", t.name, t.model, t.url))
            .collect();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            run + 1,
            esc(&path.display().to_string()),
            f.workload,
            esc(&super::hardware_label(&f.hardware)),
            esc(&targets.join("; "))
        );
    }
    h.push_str("</table>\n");
    for t in tables {
        let _ = writeln!(h, "<h2>{}</h2>", t.workload);
        table(&mut h, t);
        for n in &t.notes {
            let _ = writeln!(h, "<p class=\"excl\">{}</p>", esc(n));
        }
        if let Some((heads, rows)) = super::live_ratios(t) {
            h.push_str("<p>Stateless replay against the session's answers (end to end, p50):</p>\n<table>\n<tr>");
            for c in &heads {
                let _ = write!(h, "<th>{}</th>", esc(c));
            }
            h.push_str("</tr>\n");
            for r in &rows {
                h.push_str("<tr>");
                for c in r {
                    let _ = write!(h, "<td class=\"l\">{}</td>", esc(c));
                }
                h.push_str("</tr>\n");
            }
            h.push_str("</table>\n");
        }
        if t.workload == crate::workload::Workload::Matrix {
            matrix_grids(&mut h, files);
        }
        for m in super::metrics_of(t.workload) {
            let rows: Vec<&Row> = t.rows.iter().filter(|r| r.metric.key == m.key).collect();
            chart(&mut h, t, &rows);
        }
    }
    h.push_str("</body>\n</html>\n");
    h
}

fn table(h: &mut String, t: &Table) {
    h.push_str("<table>\n<tr><th>point</th><th>metric</th>");
    for c in &t.columns {
        let _ = write!(h, "<th>{}</th>", esc(&c.heading()));
    }
    h.push_str("<th>best vs runner-up</th></tr>\n");
    for r in &t.rows {
        let _ = write!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{} ({})</td>",
            esc(&r.point),
            esc(r.metric.title),
            esc(r.metric.unit)
        );
        for (i, c) in r.cells.iter().enumerate() {
            let best = r.best == Some(i);
            let class = if best { " class=\"best\"" } else { "" };
            let star = if best { " ★" } else { "" };
            let body = match c {
                Cell::Value { p50, p95, p99 } => {
                    let mut s = format!("<span class=\"p50\">{}{star}</span>", fmt_num(*p50));
                    if let (Some(a), Some(b)) = (p95, p99) {
                        let _ = write!(
                            s,
                            "<br/><span class=\"tail\">p95 {} · p99 {}</span>",
                            fmt_num(*a),
                            fmt_num(*b)
                        );
                    }
                    s
                }
                Cell::Excluded { failed } => {
                    format!("<span class=\"excl\">excluded ({failed} failed)</span>")
                }
                Cell::Skipped { status } => {
                    format!("<span class=\"excl\">{}</span>", status.label())
                }
                Cell::Missing => "–".to_string(),
            };
            let _ = write!(h, "<td{class}>{body}</td>");
        }
        let _ = writeln!(
            h,
            "<td class=\"l\">{}</td></tr>",
            esc(r.ratio.as_deref().unwrap_or("–"))
        );
    }
    h.push_str("</table>\n");
}

/// Horizontal grouped bars of p50: a group per point, a bar per engine; excluded and missing
/// values get no bar.
fn chart(h: &mut String, t: &Table, rows: &[&Row]) {
    let Some(first) = rows.first() else { return };
    let m = first.metric;
    let max = rows
        .iter()
        .flat_map(|r| r.cells.iter().filter_map(Cell::p50))
        .fold(0.0_f64, f64::max);
    let scale = Scale::of(
        rows.iter()
            .flat_map(|r| r.cells.iter().filter_map(Cell::p50)),
    );
    let n = t.columns.len() as f64;
    let group_h = n * BAR_H + GROUP_GAP;
    let legend_h = 20.0;
    let height = 30.0 + legend_h + group_h * rows.len() as f64;
    let width = LABEL_W + BAR_W + 110.0;
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ =
        writeln!(
        h,
        "<text x=\"0\" y=\"14\" font-size=\"13\" font-weight=\"bold\">{} — {} p50 ({}, {}{})</text>",
        t.workload,
        esc(m.title),
        esc(m.unit),
        if m.higher_is_better { "higher is better" } else { "lower is better" },
        if matches!(scale, Scale::Log { .. }) { ", log scale" } else { "" }
    );
    for (i, c) in t.columns.iter().enumerate() {
        let x = LABEL_W + i as f64 * 150.0;
        let _ = writeln!(
            h,
            "<rect x=\"{x}\" y=\"22\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"31\">{}</text>",
            COLORS[i % COLORS.len()],
            x + 14.0,
            esc(&c.name)
        );
    }
    for (g, r) in rows.iter().enumerate() {
        let y0 = 30.0 + legend_h + g as f64 * group_h;
        let _ = writeln!(
            h,
            "<text x=\"0\" y=\"{}\">{}</text>",
            y0 + n * BAR_H / 2.0 + 4.0,
            esc(&r.point)
        );
        for (i, c) in r.cells.iter().enumerate() {
            let y = y0 + i as f64 * BAR_H;
            match c.p50() {
                Some(v) if max > 0.0 => {
                    let w = (scale.fraction(v, max) * BAR_W).max(1.0);
                    let _ = writeln!(
                        h,
                        "<rect x=\"{LABEL_W}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
                        BAR_H - 2.0,
                        COLORS[i % COLORS.len()],
                        LABEL_W + w + 4.0,
                        y + BAR_H - 5.0,
                        fmt_num(v)
                    );
                }
                _ => {
                    let why = match c {
                        Cell::Excluded { .. } => "excluded",
                        Cell::Skipped { status } => status.label(),
                        _ => "no value",
                    };
                    let _ = writeln!(
                        h,
                        "<text x=\"{}\" y=\"{}\" fill=\"#a33\">{} {why}</text>",
                        LABEL_W + 4.0,
                        y + BAR_H - 5.0,
                        esc(&t.columns[i].name)
                    );
                }
            }
        }
    }
    h.push_str("</svg>\n");
}

/// matrix: a grid per target, rows of contexts and columns of simultaneous requests.
fn matrix_grids(h: &mut String, files: &[RunFile]) {
    for g in super::matrix::grids(files) {
        let _ = write!(
            h,
            "<h3>Sustained decode: {}</h3>\n<p>Total output tok/s · TTFT (p50); rows are context \
             length in tokens, columns simultaneous requests.</p>\n<table>\n<tr><th>context</th>",
            esc(&g.heading)
        );
        for n in &g.concurrency {
            let _ = write!(h, "<th>{n}</th>");
        }
        h.push_str("</tr>\n");
        for (ctx, cells) in &g.rows {
            let _ = write!(h, "<tr><th>{ctx}</th>");
            for c in cells {
                let _ = write!(h, "<td>{}</td>", esc(c));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
        if !g.prefill.is_empty() {
            h.push_str("<p>Prefill (one request, one output token; p50):</p>\n<ul>\n");
            for (ctx, text) in &g.prefill {
                let _ = writeln!(h, "<li>{ctx} tokens: {}</li>", esc(text));
            }
            h.push_str("</ul>\n");
        }
        for s in &g.statuses {
            let _ = writeln!(h, "<p>{}: {}.</p>", s.label(), esc(s.meaning()));
        }
    }
}

/// XML text escaping (also safe in attributes).
/// How bar lengths map values: linear, or logarithmic from the decade below the smallest value
/// when the values span more than a factor of 20 (a linear chart would flatten the small ones).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scale {
    Linear,
    Log { floor: f64 },
}

impl Scale {
    fn of(values: impl Iterator<Item = f64>) -> Scale {
        let (mut lo, mut hi) = (f64::INFINITY, 0.0_f64);
        for v in values.filter(|&v| v > 0.0) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if lo.is_finite() && hi / lo > 20.0 {
            Scale::Log {
                floor: 10f64.powf(lo.log10().floor()),
            }
        } else {
            Scale::Linear
        }
    }

    /// The bar's share of the full width for `v`, `max` being the largest value.
    fn fraction(self, v: f64, max: f64) -> f64 {
        match self {
            Scale::Linear => v / max,
            Scale::Log { floor } if v > 0.0 => {
                // The smallest value still gets a visible bar: one decade is a tenth of the
                // range at least.
                let span = (max / floor).log10().max(1.0);
                ((v / floor).log10() / span).clamp(0.0, 1.0)
            }
            Scale::Log { .. } => 0.0,
        }
    }
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Scale;

    #[test]
    fn values_spanning_orders_of_magnitude_chart_on_a_log_scale() {
        assert_eq!(Scale::of([3.0, 40.0].into_iter()), Scale::Linear);
        let s = Scale::of([0.22, 4.0, 620.0].into_iter());
        assert_eq!(s, Scale::Log { floor: 0.1 });
        // 0.22 is 0.34 of a decade above 0.1; the range is log10(6200) = 3.79 decades.
        assert!((s.fraction(0.22, 620.0) - 0.0904).abs() < 1e-3);
        assert_eq!(s.fraction(620.0, 620.0), 1.0);
        assert!(s.fraction(4.0, 620.0) > 2.0 * s.fraction(0.22, 620.0));
    }
}
