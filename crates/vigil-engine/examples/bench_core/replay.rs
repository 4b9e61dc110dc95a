//! `--floor`'s second figure: a decode step's matmuls alone, replayed one after another on
//! the kernel threads exactly as a step runs them (the same groups, so the same dispatches,
//! and the same warm hints), with nothing between them: no norms, RoPE, KV writes,
//! attention or sampling. Its time against the plain read of the same bytes is what the
//! matmul structure alone costs (each dispatch's start and join, each matrix's stream
//! ramping up, the tiles' own rate); the decode's time against it is what everything else
//! costs.
//!
//! `--floor`'s third figure reads the same bytes plainly but in the step's dispatches, one
//! plain read a job (`read by job`): what the dispatches alone cost a decode whose every
//! dispatch read memory as fast as a plain read does.

use vigil_kernels::matmul::matmul_group;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::QMatrix;
use vigil_model::weights::{FeedForward, ModelWeights};

/// One dispatch of a decode step: the matrices it runs on one activation row (views of the
/// model's bytes: a `QMatrix` clone shares its buffer).
pub struct Job(Vec<QMatrix>);

impl Job {
    pub fn matrices(&self) -> &[QMatrix] {
        &self.0
    }
}

/// A decode step's matmul dispatches in order, grouped as `Model::forward` groups them: each
/// layer's Q, K and V; its output projection; its gate and up; its down; then the vocabulary
/// projection. A routed-experts layer replays its router and every expert (a step runs only
/// the chosen ones).
pub fn decode_jobs(w: &ModelWeights) -> Vec<Job> {
    let mut jobs = Vec::new();
    for l in &w.layers {
        jobs.push(Job(vec![l.wq.clone(), l.wk.clone(), l.wv.clone()]));
        jobs.push(Job(vec![l.wo.clone()]));
        match &l.ffn {
            FeedForward::Dense(m) => {
                jobs.push(Job(vec![m.gate.clone(), m.up.clone()]));
                jobs.push(Job(vec![m.down.clone()]));
            }
            FeedForward::Sparse(moe) => {
                jobs.push(Job(vec![moe.router.clone()]));
                for m in &moe.experts {
                    jobs.push(Job(vec![m.gate.clone(), m.up.clone()]));
                    jobs.push(Job(vec![m.down.clone()]));
                }
            }
        }
    }
    jobs.push(Job(vec![w.output.clone()]));
    jobs
}

/// Buffers for replaying `jobs`: one activation row as wide as the widest input, and an output
/// as tall as each group slot's tallest matrix.
pub struct Replay {
    jobs: Vec<Job>,
    x: Vec<f32>,
    outs: Vec<Vec<f32>>,
}

impl Replay {
    pub fn new(jobs: Vec<Job>) -> Self {
        let cols = jobs.iter().flat_map(|j| &j.0).map(|m| m.cols).max();
        // Small values of both signs, so every format's activation quantization has work.
        let x = (0..cols.unwrap_or(0))
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        let slots = jobs.iter().map(|j| j.0.len()).max().unwrap_or(0);
        let outs = (0..slots)
            .map(|s| {
                let rows = jobs.iter().filter_map(|j| j.0.get(s)).map(|m| m.rows);
                vec![0.0; rows.max().unwrap_or(0)]
            })
            .collect();
        Replay { jobs, x, outs }
    }

    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }

    /// Run every job once, each with the next one's weights as its warm hint, as
    /// `Model::forward` names them.
    pub fn step(&mut self, pool: &ThreadPool) {
        for (i, job) in self.jobs.iter().enumerate() {
            // Arrays, not vectors: the step the replay stands for allocates nothing here.
            let next = self
                .jobs
                .get(i + 1)
                .or(self.jobs.first())
                .map_or(&[][..], |n| &n.0);
            let mut hint: [&[u8]; 4] = [&[]; 4];
            for (h, m) in hint.iter_mut().zip(next) {
                *h = m.data.bytes();
            }
            pool.warm_next(&hint[..next.len().min(4)]);
            let cols = job.0[0].cols;
            let mut ws: [&QMatrix; 4] = [&job.0[0]; 4];
            for (w, m) in ws.iter_mut().zip(&job.0) {
                *w = m;
            }
            let ws = &ws[..job.0.len().min(4)];
            let mut outs: Vec<&mut [f32]> = (self.outs.iter_mut().zip(&job.0))
                .map(|(o, m)| &mut o[..m.rows])
                .collect();
            matmul_group(pool, ws, &self.x[..cols], 1, &mut outs);
        }
    }
}
