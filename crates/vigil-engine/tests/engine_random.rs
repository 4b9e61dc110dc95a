//! The engine under churn on a tiny model: random arrivals with shared prefixes (prefix-cache
//! hits), aborts, a KV pool small enough to force preemption, mixed prefill chunks and decode.
//! After every step the block-accounting invariant holds; at the end no block is used; and
//! every completed greedy output equals the same request run alone.

use std::collections::HashMap;
use vigil_engine::engine::LlmEngine;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{SeqId, StopCriteria};

use common::{tiny_engine, Lcg};

mod common;

fn engine(num_blocks: usize, config: SchedulerConfig) -> LlmEngine {
    tiny_engine(num_blocks, config, 2)
}

fn greedy(max_tokens: usize) -> StopCriteria {
    StopCriteria {
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

fn run_alone(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut e = engine(64, SchedulerConfig::default());
    let id = e.add_request(
        prompt.to_vec(),
        SamplingParams::default(),
        greedy(max_tokens),
    );
    while e.has_work() {
        e.step().unwrap();
    }
    e.take_finished(id).unwrap().output_ids().to_vec()
}

#[test]
fn churn_keeps_invariants_and_outputs() {
    // 24 blocks of 4 tokens: a few 15-56 token sequences fill it, so preemption happens.
    let config = SchedulerConfig {
        max_batched_tokens: 24,
        max_seqs: 8,
        watermark: 0.0,
        enable_prefix_cache: true,
        ..SchedulerConfig::default()
    };
    let mut e = engine(24, config);
    let mut rng = Lcg(7);
    let shared: Vec<Vec<u32>> = (0..3)
        .map(|_| (0..12).map(|_| rng.next(380) as u32 + 3).collect())
        .collect();
    let mut requests: HashMap<SeqId, (Vec<u32>, usize)> = HashMap::new();
    let mut finished: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut aborted = 0;
    let mut cached_tokens = 0;
    for step in 0..400 {
        if step < 250 && rng.next(2) == 0 {
            let mut prompt = shared[rng.next(3) as usize].clone();
            let extra = 1 + rng.next(20) as usize;
            prompt.extend((0..extra).map(|_| rng.next(380) as u32 + 3));
            let max_tokens = 1 + rng.next(24) as usize;
            let id = e.add_request(
                prompt.clone(),
                SamplingParams::default(),
                greedy(max_tokens),
            );
            requests.insert(id, (prompt, max_tokens));
        }
        if rng.next(25) == 0 {
            let mut live: Vec<SeqId> = e
                .seqs
                .keys()
                .copied()
                .filter(|id| !finished.contains_key(id))
                .collect();
            live.sort_unstable();
            if let Some(&victim) = live.get(rng.next(live.len().max(1) as u64) as usize) {
                e.abort(victim);
                requests.remove(&victim);
                aborted += 1;
            }
        }
        for out in e.step().unwrap() {
            if out.finished.is_some() {
                let seq = e.take_finished(out.seq_id).unwrap();
                cached_tokens += seq.num_cached_tokens;
                finished.insert(out.seq_id, seq.output_ids().to_vec());
            }
        }
        e.check_invariants()
            .unwrap_or_else(|err| panic!("step {step}: {err}"));
    }
    while e.has_work() {
        for out in e.step().unwrap() {
            if out.finished.is_some() {
                let seq = e.take_finished(out.seq_id).unwrap();
                finished.insert(out.seq_id, seq.output_ids().to_vec());
            }
        }
        e.check_invariants().unwrap();
    }
    assert!(e.seqs.is_empty(), "sequences left behind");
    assert_eq!(e.pool.borrow().num_used_blocks(), 0, "blocks leaked");
    assert!(
        e.scheduler.num_preemptions > 0,
        "the pool was never under pressure"
    );
    assert!(
        finished.len() >= 40,
        "only {} requests finished",
        finished.len()
    );
    assert!(cached_tokens > 0, "no prefix-cache hit");
    eprintln!("{} finished, {aborted} aborted, {} preemptions, {cached_tokens} prompt tokens from the prefix cache", finished.len(), e.scheduler.num_preemptions);
    for (id, output) in &finished {
        let (prompt, max_tokens) = &requests[id];
        assert_eq!(output.len(), *max_tokens);
        assert_eq!(
            output,
            &run_alone(prompt, *max_tokens),
            "request {id} differs from running alone"
        );
    }
}
