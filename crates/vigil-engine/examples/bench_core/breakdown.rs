//! `bench_core --breakdown`: where a step spends its time, from the model's probe points.
//!
//! The probe (`Model::probe`) is called at llama.cpp's graph node names as a step goes through
//! the model; the time from one point to the next is charged to the part of the step between
//! them (the QKV projections, attention, the MLP, ...). The probe only reads the clock, so the
//! figures are those of the plain step within a few microseconds a layer. The time from a
//! step's last point to the next step's first (sampling, scheduling) is charged to "between
//! steps" while the same kind of step follows.
//!
//! A matmul part also gets its weights' bytes per token over its time: for a decode step on
//! weights that do not fit in cache, the rate its reads ran at.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vigil_model::weights::{FeedForward, ModelWeights};

/// The parts of a step, in the order a step reaches them (indices: the constants below).
const PARTS: [&str; 7] = [
    "QKV projections, q/k norm, RoPE",
    "attention (KV write + paged attention)",
    "output projection + residual",
    "MLP (gate/up, activation, down)",
    "norms, residuals",
    "vocabulary projection",
    "between steps (sample, schedule)",
];
const QKV: usize = 0;
const ATTENTION: usize = 1;
const OUTPUT_PROJ: usize = 2;
const MLP: usize = 3;
const NORMS: usize = 4;
const VOCAB: usize = 5;
/// From a step's last probe point to the next step's first.
const BETWEEN: usize = 6;

/// Which part the time from probe point `prev` to point `name` belongs to.
fn part_of(prev: &str, name: &str) -> usize {
    match (prev, name) {
        (_, "embd") => BETWEEN,
        (_, "Qcur") => QKV,
        (_, "kqv_out") => ATTENTION,
        (_, "attn_out") => OUTPUT_PROJ,
        (_, "ffn_up") => MLP,
        // A routed-experts block has no `ffn_up` point: norm to output is the experts'.
        ("ffn_norm", "ffn_out") => MLP,
        (_, "result_output") => VOCAB,
        // Everything else between two points: norms, residual adds, Gemma's post-norms.
        _ => NORMS,
    }
}

/// The time of each part, summed over the steps of one kind (decode or prefill).
#[derive(Default)]
struct Totals {
    parts: [Duration; PARTS.len()],
    steps: usize,
    tokens: usize,
}

/// What the probe records, shared with the benchmark that reads it.
#[derive(Default)]
pub struct Recorder {
    on: bool,
    /// The last probe point seen, and when.
    last: Option<(Instant, &'static str)>,
    /// Whether the current step decodes (one token); None outside a step.
    decoding: Option<bool>,
    decode: Totals,
    prefill: Totals,
}

/// The probe points, as `'static` names (the probe receives borrowed ones).
const POINTS: [&str; 15] = [
    "embd",
    "attn_norm",
    "Qcur",
    "Kcur",
    "Vcur",
    "kqv_out",
    "attn_out",
    "ffn_inp",
    "ffn_norm",
    "ffn_up",
    "ffn_swiglu",
    "ffn_out",
    "l_out",
    "result_norm",
    "result_output",
];

impl Recorder {
    fn see(&mut self, name: &str, rows: usize) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        let name = POINTS
            .iter()
            .find(|p| **p == name)
            .copied()
            .unwrap_or("other");
        if name == "embd" {
            let decoding = rows == 1;
            // Between two steps of one kind: the engine's own work.
            if let (Some((t, "result_output")), Some(prev)) = (self.last, self.decoding) {
                if prev == decoding {
                    self.totals(decoding).parts[BETWEEN] += now - t;
                }
            }
            self.decoding = Some(decoding);
            let totals = self.totals(decoding);
            totals.steps += 1;
            totals.tokens += rows;
        } else if let (Some((t, prev)), Some(decoding)) = (self.last, self.decoding) {
            self.totals(decoding).parts[part_of(prev, name)] += now - t;
        }
        self.last = Some((now, name));
    }

    fn totals(&mut self, decoding: bool) -> &mut Totals {
        if decoding {
            &mut self.decode
        } else {
            &mut self.prefill
        }
    }
}

/// The weight bytes each matmul part reads per token (for its GB/s).
pub struct PartBytes([usize; PARTS.len()]);

impl PartBytes {
    pub fn of(w: &ModelWeights) -> PartBytes {
        let mut b = [0usize; PARTS.len()];
        for l in &w.layers {
            b[QKV] += [&l.wq, &l.wk, &l.wv]
                .iter()
                .map(|m| m.data.bytes().len())
                .sum::<usize>();
            b[OUTPUT_PROJ] += l.wo.data.bytes().len();
            if let FeedForward::Dense(mlp) = &l.ffn {
                b[MLP] += [&mlp.gate, &mlp.up, &mlp.down]
                    .iter()
                    .map(|m| m.data.bytes().len())
                    .sum::<usize>();
            }
        }
        b[VOCAB] = w.output.data.bytes().len();
        PartBytes(b)
    }
}

/// A recorder and the probe that feeds it (`hidden`: the model's width, to count a step's
/// tokens from its embeddings).
pub fn recorder(hidden: usize) -> (Arc<Mutex<Recorder>>, vigil_model::model::Probe) {
    let rec = Arc::new(Mutex::new(Recorder::default()));
    let feed = rec.clone();
    let probe = Box::new(move |name: &str, _layer: Option<usize>, data: &[f32]| {
        if let Ok(mut r) = feed.lock() {
            r.see(name, data.len() / hidden.max(1));
        }
    });
    (rec, probe)
}

/// Start recording afresh.
pub fn start(rec: &Mutex<Recorder>) {
    if let Ok(mut r) = rec.lock() {
        *r = Recorder {
            on: true,
            ..Recorder::default()
        };
    }
}

/// Forget the last point (a new request starts: the time since is not a step's).
pub fn new_request(rec: &Mutex<Recorder>) {
    if let Ok(mut r) = rec.lock() {
        r.last = None;
        r.decoding = None;
    }
}

/// Stop recording and print one JSON line per part for `test`'s decode or prefill steps.
pub fn report(rec: &Mutex<Recorder>, test: &str, decode: bool, bytes: &PartBytes) {
    let Ok(mut r) = rec.lock() else { return };
    r.on = false;
    let t = if decode { &r.decode } else { &r.prefill };
    let total: Duration = t.parts.iter().sum();
    if t.tokens == 0 || total.is_zero() {
        return;
    }
    for (i, name) in PARTS.iter().enumerate() {
        let secs = t.parts[i].as_secs_f64();
        let per_token_ms = 1e3 * secs / t.tokens as f64;
        let gb_s = if bytes.0[i] > 0 && decode && secs > 0.0 {
            format!(
                ", \"weight_gb_s\": {:.2}",
                bytes.0[i] as f64 * t.tokens as f64 / secs / 1e9
            )
        } else {
            String::new()
        };
        println!(
            "{{\"engine\": \"vigil\", \"test\": \"{test}-breakdown\", \"part\": \"{name}\", \"steps\": {}, \"ms_per_token\": {per_token_ms:.4}, \"share_pct\": {:.1}{gb_s}}}",
            t.steps,
            100.0 * secs / total.as_secs_f64()
        );
    }
}
