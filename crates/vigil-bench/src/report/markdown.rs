//! The Markdown summary: what ran where, then one table per workload.

use super::{fmt_num, Cell, Table};
use crate::result::RunFile;
use crate::workload::Workload;
use std::fmt::Write;
use std::path::PathBuf;

pub fn render(files: &[RunFile], tables: &[Table], inputs: &[PathBuf]) -> String {
    let mut md = String::from("# Benchmark report\n\n");
    md.push_str(
        "p50 in large type, p95 · p99 beneath; ★ marks the best value of each row (none on a tie); the ratio \
         compares the best with the runner-up and names both values. Points with any failed \
         request are excluded and never ranked.\n\n",
    );
    md.push_str(
        "## Runs\n\n| run | file | workload | hardware | targets |\n|---|---|---|---|---|\n",
    );
    for (run, (f, path)) in files.iter().zip(inputs).enumerate() {
        let hw = super::hardware_label(&f.hardware);
        let targets: Vec<String> = f
            .targets
            .iter()
            .map(|t| {
                format!(
                    "{} = {} at {} (engine: {}{})",
                    t.name,
                    t.model,
                    t.url,
                    engine_name(t.owned_by.as_deref()),
                    (t.server_header.as_deref())
                        .map_or(String::new(), |s| format!(", server: {s}"))
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            run + 1,
            esc(&path.display().to_string()),
            f.workload,
            esc(&hw),
            esc(&targets.join("; "))
        );
    }
    for t in tables {
        let _ = write!(md, "\n## {}\n\n| point | metric |", t.workload);
        for c in &t.columns {
            let _ = write!(md, " {} |", esc(&c.heading()));
        }
        md.push_str(" best vs runner-up |\n|---|---|");
        md.push_str(&"---|".repeat(t.columns.len() + 1));
        md.push('\n');
        for r in &t.rows {
            let _ = write!(
                md,
                "| {} | {} ({}) |",
                esc(&r.point),
                r.metric.title,
                r.metric.unit
            );
            for (i, c) in r.cells.iter().enumerate() {
                let star = if r.best == Some(i) { " ★" } else { "" };
                let text = match c {
                    Cell::Value { p50, p95, p99 } => match (p95, p99) {
                        (Some(a), Some(b)) => format!(
                            "**{}**{star}<br><sub>p95 {} · p99 {}</sub>",
                            fmt_num(*p50),
                            fmt_num(*a),
                            fmt_num(*b)
                        ),
                        _ => format!("**{}**{star}", fmt_num(*p50)),
                    },
                    Cell::Excluded { failed } => format!("excluded ({failed} failed)"),
                    Cell::Skipped { status } => status.label().to_string(),
                    Cell::Missing => "–".to_string(),
                };
                let _ = write!(md, " {text} |");
            }
            let _ = writeln!(md, " {} |", r.ratio.as_deref().map_or("–".into(), esc));
        }
        for n in &t.notes {
            let _ = writeln!(md, "\n- {}", esc(n));
        }
        if let Some((heads, rows)) = super::live_ratios(t) {
            live_section(&mut md, files, &heads, &rows);
        }
        if t.workload == Workload::Matrix {
            matrix_section(&mut md, files);
        }
    }
    md
}

/// matrix: a grid per target, rows of contexts and columns of simultaneous requests.
fn matrix_section(md: &mut String, files: &[RunFile]) {
    for g in super::matrix::grids(files) {
        let _ = write!(
            md,
            "\n### Sustained decode: {}\n\nTotal output tok/s · TTFT (p50); rows are context \
             length in tokens, columns simultaneous requests.\n\n| context |",
            esc(&g.heading)
        );
        for n in &g.concurrency {
            let _ = write!(md, " {n} |");
        }
        let _ = writeln!(md, "\n|---|{}", "---|".repeat(g.concurrency.len()));
        for (ctx, cells) in &g.rows {
            let _ = write!(md, "| {ctx} |");
            for c in cells {
                let _ = write!(md, " {} |", esc(c));
            }
            md.push('\n');
        }
        if !g.prefill.is_empty() {
            md.push_str("\nPrefill (one request, one output token; p50):\n\n");
            for (ctx, text) in &g.prefill {
                let _ = writeln!(md, "- {ctx} tokens: {}", esc(text));
            }
        }
        if !g.statuses.is_empty() {
            md.push('\n');
        }
        for s in &g.statuses {
            let _ = writeln!(md, "- {}: {}.", s.label(), s.meaning());
        }
    }
}

/// live-stream: how the stream ran on each target, and the replay ratios.
fn live_section(md: &mut String, files: &[RunFile], heads: &[String], rows: &[Vec<String>]) {
    md.push_str("\nStateless replay against the session's answers (end to end, p50):\n\n|");
    for h in heads {
        let _ = write!(md, " {} |", esc(h));
    }
    let _ = writeln!(md, "\n|{}", "---|".repeat(heads.len()));
    for r in rows {
        md.push('|');
        for c in r {
            let _ = write!(md, " {} |", esc(c));
        }
        md.push('\n');
    }
    md.push('\n');
    for f in files.iter().filter(|f| f.workload == Workload::LiveStream) {
        let s = &f.settings;
        let _ = writeln!(
            md,
            "Stream: entries of about {} tokens every {} ms into a {}-token window; {}-token \
             answers, asked {} after each push; measured queries after {} warm-up each: flash \
             {}, cold {}, replay {}.\n",
            s.entry_tokens,
            s.period_ms,
            s.window_tokens,
            s.answer_tokens,
            s.query_offset_ms.map_or(
                format!("{} ms (half a period)", s.period_ms / 2),
                |o| format!("{o} ms")
            ),
            s.warmup,
            s.iterations,
            s.cold_iterations.unwrap_or(s.iterations),
            s.replay_iterations.unwrap_or(s.iterations)
        );
        for t in &f.targets {
            let Some(l) = &t.live else { continue };
            let tokens = l.entry_tokens.map_or("?".into(), |e| {
                format!("{:.1} ({}–{})", e.mean, e.min, e.max)
            });
            let mut line = format!(
                "- {}: {} entries, tokens mean {tokens} (counted with `{}`)",
                t.name, l.entries, l.count_method
            );
            if let Some(w) = &l.window_check {
                let _ = write!(
                    line,
                    "; window after the fill: client {} entries / {} tokens, server {} / {}{}",
                    w.client_entries,
                    w.client_tokens,
                    w.server_entries,
                    w.server_tokens,
                    if w.same_entries {
                        ""
                    } else {
                        " (entries differ)"
                    }
                );
            }
            if let Some(q) = &l.flash_query {
                let n = |k: &str| q.get(k).map_or("?".into(), |v| v.to_string());
                let eval_ms = q.get("eval_ms").and_then(serde_json::Value::as_f64);
                let _ = write!(
                    line,
                    "; flash query: {} evaluations, {} versions skipped, last took {} ms",
                    n("evaluations"),
                    n("skipped"),
                    eval_ms.map_or("?".into(), fmt_num)
                );
            }
            if let Some(e) = &l.session_end {
                let n = |k: &str| e.get(k).map_or("?".into(), |v| v.to_string());
                let _ = write!(
                    line,
                    "; session: data_version {}, {} window recomputes, {} entries evicted",
                    n("data_version"),
                    n("window_recomputes"),
                    n("evicted")
                );
            }
            if l.push_errors > 0 || l.dropped_entries > 0 || l.stream_stalls > 0 {
                let _ = write!(
                    line,
                    "; {} pushes failed, {} entries dropped, {} pushes waited for sizing",
                    l.push_errors, l.dropped_entries, l.stream_stalls
                );
            }
            let held: Vec<String> = (t.points.iter())
                .filter_map(|p| {
                    let v = (p.samples.iter())
                        .filter(|x| !x.warmup && x.error.is_none())
                        .filter_map(|x| x.held_tokens.map(f64::from));
                    let h = crate::stats::Summary::of(v)?;
                    Some(format!("{} {} ({}–{})", p.label, h.p50, h.min, h.max))
                })
                .collect();
            if !held.is_empty() {
                let _ = write!(line, "; held tokens p50 (min–max): {}", held.join(", "));
            }
            if let Some(r) = &l.replayed {
                let _ = write!(line, "; replays re-sent the {r}");
            }
            if let Some(r) = &l.resident_ms {
                let _ = write!(
                    line,
                    "; push to resident: p50 {} ms, p95 {}, max {} ({} never resident)",
                    fmt_num(r.p50),
                    fmt_num(r.p95),
                    fmt_num(r.max),
                    l.never_resident
                );
            }
            if let Some(c) = &l.chat_load {
                let _ = write!(
                    line,
                    "; beside {} chat streams: {} requests ({} failed), {} output tok/s, TTFT p50 {} ms",
                    c.streams,
                    c.requests,
                    c.failed,
                    fmt_num(c.output_tok_s),
                    c.ttft_ms.map_or("?".into(), |t| fmt_num(t.p50))
                );
            }
            if let Some(m) = &l.window_mode {
                let _ = write!(line, "; window mode {m}");
            }
            if let Some(a) = &l.window_agreement {
                let _ = write!(
                    line,
                    "; flash answers equal to exact mode's after {} of {} entries ({} shifts)",
                    a.agreed, a.compared, a.shifts
                );
            }
            if !l.sessions {
                line.push_str("; no session API");
            }
            let _ = writeln!(md, "{}", esc(&line));
        }
    }
}

/// Keeps a value inside its table cell.
fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The engine a target's `/v1/models` `owned_by` names; llama-cpp-python's server says `me`.
fn engine_name(owned_by: Option<&str>) -> String {
    match owned_by {
        Some("me") => "llama-cpp-python (owned_by: me)".to_string(),
        Some(o) => o.to_string(),
        None => "?".to_string(),
    }
}
