//! The Markdown summary: what ran where, then one table per workload.

use super::{fmt_num, Cell, Table};
use crate::result::RunFile;
use std::fmt::Write;
use std::path::PathBuf;

pub fn render(files: &[RunFile], tables: &[Table], inputs: &[PathBuf]) -> String {
    let mut md = String::from("# Benchmark report\n\n");
    md.push_str(
        "p50 in large type, p95 · p99 beneath; ★ marks the best value of each row; the ratio \
         compares the best with the runner-up and names both values. Points with any failed \
         request are excluded and never ranked.\n\n",
    );
    md.push_str("## Runs\n\n| file | workload | hardware | targets |\n|---|---|---|---|\n");
    for (f, path) in files.iter().zip(inputs) {
        let hw = format!(
            "{} ({} cores)",
            f.hardware.cpu_model.as_deref().unwrap_or("unknown CPU"),
            f.hardware.cores
        );
        let targets: Vec<String> = f
            .targets
            .iter()
            .map(|t| {
                format!(
                    "{} = {} at {} (engine: {})",
                    t.name,
                    t.model,
                    t.url,
                    t.owned_by.as_deref().unwrap_or("?")
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
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
                    Cell::Missing => "–".to_string(),
                };
                let _ = write!(md, " {text} |");
            }
            let _ = writeln!(md, " {} |", r.ratio.as_deref().map_or("–".into(), esc));
        }
        for n in &t.notes {
            let _ = writeln!(md, "\n- {}", esc(n));
        }
    }
    md
}

/// Keeps a value inside its table cell.
fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
