//! The priority scheduler on a tiny real model. A long randomized run mixes arrivals of every
//! class with shared prefixes, client disconnects of running and waiting sequences, and a KV
//! pool small enough to preempt; after every step the block accounting and the queues agree,
//! and no sequence is preempted while one of a lower class keeps running. Two directed tests
//! check the class contract: background arrivals never delay a foreground request's first
//! token, and the age bound serves a background request under constant foreground load. One
//! model-free test pins down preemption: the victim readmits from its committed blocks.

use std::collections::{HashMap, HashSet};
use vigil_engine::block_table::SharedBlockPool;
use vigil_engine::engine::LlmEngine;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, StepPlan};
use vigil_engine::sequence::{Priority, SeqId, SeqStatus, Sequence, StopCriteria};
use vigil_engine::speculative::SpecMethod;

use common::{tiny_engine, Lcg, BLOCK};

mod common;

const VOCAB: u64 = 380;

fn engine(num_blocks: usize, config: SchedulerConfig) -> LlmEngine {
    tiny_engine(num_blocks, config, 2)
}

trait LcgTokens {
    fn tokens(&mut self, n: usize) -> Vec<u32>;
}

impl LcgTokens for Lcg {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next(VOCAB) as u32 + 3).collect()
    }
}

fn greedy(max_tokens: usize) -> StopCriteria {
    StopCriteria {
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

fn add(e: &mut LlmEngine, prompt: Vec<u32>, max_tokens: usize, priority: Priority) -> SeqId {
    e.add_request_with_priority(
        prompt,
        SamplingParams::default(),
        greedy(max_tokens),
        priority,
    )
}

/// Running sequences and the class the scheduler treats each as.
fn running_classes(e: &LlmEngine) -> Vec<(SeqId, Priority)> {
    (e.scheduler.running.iter())
        .map(|id| (*id, e.seqs[id].effective_priority()))
        .collect()
}

/// The queues and the sequences agree: running ones hold a table, waiting ones none.
fn check_queues(e: &LlmEngine) -> Result<(), String> {
    let live = e.seqs.values().filter(|s| !s.is_finished()).count();
    if e.num_running() + e.num_waiting() != live {
        return Err(format!(
            "{} running + {} waiting != {live} live sequences",
            e.num_running(),
            e.num_waiting()
        ));
    }
    for id in &e.scheduler.running {
        let s = &e.seqs[id];
        if s.status != SeqStatus::Running || s.table.is_none() {
            return Err(format!("running {id} is {:?}", s.status));
        }
    }
    for id in &e.scheduler.waiting {
        let s = &e.seqs[id];
        if s.status != SeqStatus::Waiting || s.table.is_some() {
            return Err(format!("waiting {id} is {:?} or holds blocks", s.status));
        }
    }
    Ok(())
}

struct Request {
    prompt: Vec<u32>,
    max_tokens: usize,
}

#[derive(Default)]
struct Counts {
    finished: usize,
    aborted_running: usize,
    aborted_mid_generation: usize,
    aborted_waiting: usize,
    preempted: HashMap<Priority, usize>,
    cached_tokens: usize,
}

#[test]
fn priority_churn_keeps_invariants() {
    churn(SpecMethod::Off);
}

/// The same churn with speculative decoding: every verification's rollback (draft KV past
/// the confirmed tokens dropped, blocks crossed by a draft given back) keeps the block
/// accounting, and the outputs are still what each request generates alone without it.
#[test]
fn priority_churn_with_speculation_keeps_invariants() {
    churn(SpecMethod::Suffix);
}

/// And with a draft model (the target's weights in BF16), whose own KV follows every
/// preemption, abort and rollback.
#[test]
fn priority_churn_with_a_draft_model_keeps_invariants() {
    churn(SpecMethod::Draft);
}

fn churn(method: SpecMethod) {
    // 32 blocks of 4 tokens against 20-45 token sequences: the pool runs out, so the scheduler
    // preempts; four shared prefixes make prefix-cache hits.
    let config = SchedulerConfig {
        max_batched_tokens: 16,
        max_seqs: 8,
        watermark: 0.0,
        enable_prefix_cache: true,
        promote_after_steps: 40,
        max_lower_tokens_with_foreground: usize::MAX,
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        session_seats: 0,
        session_chunk_tokens: usize::MAX,
        session_step_budget: usize::MAX,
        decode_step_budget: usize::MAX,
    };
    let mut e = engine(32, config);
    e.spec.method = method;
    if method == SpecMethod::Draft {
        common::attach_draft(&mut e, "llama_bf16", 64);
    }
    let mut rng = Lcg(11);
    let shared: Vec<Vec<u32>> = (0..4).map(|i| rng.tokens(8 + 4 * i)).collect();
    let classes = [Priority::Foreground, Priority::Ingest, Priority::Background];
    let mut requests: HashMap<SeqId, Request> = HashMap::new();
    let mut outputs: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut c = Counts::default();
    let mut step = 0;
    while step < 4000 || e.has_work() {
        // Bursts above the step budget alternate with lulls that drain the queue, so lower
        // classes wait long enough to be promoted.
        let rate = if (step / 250) % 2 == 0 { 4 } else { 1 };
        if step < 4000 && rng.next(5) < rate {
            let mut prompt = shared[rng.next(4) as usize].clone();
            let extra = 1 + rng.next(12) as usize;
            prompt.extend(rng.tokens(extra));
            let max_tokens = 1 + rng.next(16) as usize;
            let priority = classes[rng.next(3) as usize];
            let id = add(&mut e, prompt.clone(), max_tokens, priority);
            requests.insert(id, Request { prompt, max_tokens });
        }
        if step < 4000 && rng.next(12) == 0 {
            let mut live: Vec<SeqId> = e.seqs.keys().copied().collect();
            live.sort_unstable();
            if let Some(&victim) = live.get(rng.next(live.len().max(1) as u64) as usize) {
                let seq = &e.seqs[&victim];
                match seq.status {
                    SeqStatus::Running => {
                        c.aborted_running += 1;
                        if seq.num_output_tokens() > 0 {
                            c.aborted_mid_generation += 1;
                        }
                    }
                    _ => c.aborted_waiting += 1,
                }
                e.abort(victim);
                requests.remove(&victim);
            }
        }

        let before = running_classes(&e);
        for out in e.step().unwrap() {
            if out.finished.is_some() {
                let seq = e.take_finished(out.seq_id).unwrap();
                c.cached_tokens += seq.num_cached_tokens;
                c.finished += 1;
                outputs.insert(out.seq_id, seq.output_ids().to_vec());
            }
        }
        e.check_invariants()
            .unwrap_or_else(|err| panic!("step {step}: {err}"));
        check_queues(&e).unwrap_or_else(|err| panic!("step {step}: {err}"));

        // Preempted this step: running before, waiting now.
        let after = running_classes(&e);
        for &(id, class) in &before {
            if e.seqs
                .get(&id)
                .is_some_and(|s| s.status == SeqStatus::Waiting)
            {
                *c.preempted.entry(class).or_default() += 1;
                if let Some(&(kept, lower)) = after.iter().find(|&&(_, k)| k < class) {
                    panic!("step {step}: {id} ({class:?}) preempted while {kept} ({lower:?}) runs");
                }
            }
        }
        step += 1;
    }

    assert!(e.seqs.is_empty(), "sequences left behind");
    if e.draft.is_some() {
        e.step().unwrap();
        let used = e.draft.as_ref().map(|d| d.num_used_blocks());
        assert_eq!(used, Some(0), "draft blocks leaked");
    }
    assert_eq!(e.pool.borrow().num_used_blocks(), 0, "blocks leaked");
    assert_eq!((e.num_running(), e.num_waiting()), (0, 0));
    let preemptions: usize = c.preempted.values().sum();
    eprintln!(
        "{step} steps: {} finished, {} aborted running ({} mid-generation), {} aborted waiting, \
         preempted {:?}, {} promoted, {} prompt tokens from the prefix cache",
        c.finished,
        c.aborted_running,
        c.aborted_mid_generation,
        c.aborted_waiting,
        c.preempted,
        e.scheduler.num_promotions,
        c.cached_tokens
    );
    assert_eq!(preemptions as u64, e.scheduler.num_preemptions);
    let spec = e.spec_stats;
    eprintln!("speculation: {spec:?}");
    if method != SpecMethod::Off {
        assert!(spec.accepted_tokens > 0, "no draft token accepted");
        assert!(
            spec.accepted_tokens < spec.proposed_tokens,
            "no draft rejected"
        );
    }
    assert!(preemptions > 0, "the pool was never under pressure");
    assert!(c.cached_tokens > 0, "no prefix-cache hit");
    // Drafts finish sequences sooner, so the queue may never get old enough to promote:
    // the class contract is the plain run's to check.
    assert!(
        method != SpecMethod::Off || e.scheduler.num_promotions > 0,
        "no lower class hit the age bound"
    );
    assert!(
        c.aborted_mid_generation > 0,
        "no running sequence was aborted"
    );
    assert!(c.aborted_waiting > 0, "no waiting sequence was aborted");
    assert!(c.finished >= 800, "only {} requests finished", c.finished);

    // Every request that was not aborted ran to its length, and a sample of them generated
    // what they generate alone (prefix hits and preemption change no token).
    assert_eq!(outputs.len(), requests.len());
    let mut alone = engine(64, SchedulerConfig::default());
    let mut ids: Vec<SeqId> = outputs.keys().copied().collect();
    ids.sort_unstable();
    for id in ids.iter().step_by(ids.len() / 25) {
        let (req, out) = (&requests[id], &outputs[id]);
        assert_eq!(out.len(), req.max_tokens);
        let a = add(
            &mut alone,
            req.prompt.clone(),
            req.max_tokens,
            Priority::Foreground,
        );
        while alone.has_work() {
            alone.step().unwrap();
        }
        let single = alone.take_finished(a).unwrap();
        assert_eq!(out, single.output_ids(), "request {id} differs from alone");
    }
}

#[test]
fn background_arrivals_never_delay_foreground_tokens() {
    let config = SchedulerConfig {
        max_batched_tokens: 16,
        max_seqs: 6,
        watermark: 0.0,
        enable_prefix_cache: true,
        promote_after_steps: 1_000_000,
        max_lower_tokens_with_foreground: usize::MAX,
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        session_seats: 0,
        session_chunk_tokens: usize::MAX,
        session_step_budget: usize::MAX,
        decode_step_budget: usize::MAX,
    };
    let mut e = engine(24, config);
    let mut rng = Lcg(5);
    let mut foreground: HashSet<SeqId> = HashSet::new();
    let mut admissions_by_preemption = 0;
    let mut served = 0;
    for step in 0..600 {
        for _ in 0..1 + rng.next(2) {
            let len = 8 + rng.next(7) as usize;
            add(&mut e, rng.tokens(len), 30, Priority::Background);
        }
        if step % 15 == 7 {
            let len = 6 + rng.next(7) as usize;
            // Background holds the seats or blocks this request needs: it gets in only by
            // preempting background.
            let blocks_free = e.pool.borrow().num_free_blocks();
            if e.num_running() == 6 || blocks_free < len.div_ceil(BLOCK) {
                admissions_by_preemption += 1;
            }
            foreground.insert(add(&mut e, rng.tokens(len), 10, Priority::Foreground));
        }
        // Every live foreground request gets a token this step: its first one in the step
        // it arrived in, then one per step.
        let expected: HashSet<SeqId> = foreground.clone();
        let mut got: HashSet<SeqId> = HashSet::new();
        for out in e.step().unwrap() {
            if foreground.contains(&out.seq_id) {
                got.insert(out.seq_id);
                if out.finished.is_some() {
                    foreground.remove(&out.seq_id);
                    served += 1;
                }
            }
            if out.finished.is_some() {
                e.take_finished(out.seq_id).unwrap();
            }
        }
        assert_eq!(
            got, expected,
            "step {step}: a foreground request got no token"
        );
        e.check_invariants().unwrap();
        check_queues(&e).unwrap();
    }
    eprintln!(
        "{served} foreground served, {admissions_by_preemption} admitted by preempting \
         background, {} background waiting",
        e.num_waiting()
    );
    assert!(served >= 35, "only {served} foreground requests served");
    assert!(
        admissions_by_preemption > 0,
        "background never held the blocks a foreground arrival needed"
    );
    assert_eq!(e.scheduler.num_promotions, 0);
}

/// Steps until a request of class `low` finishes while foreground requests keep two seats
/// and the queue full, or `None` if it has not within `max_steps`.
fn low_finish_step(
    low: Priority,
    promote_after_steps: u64,
    session_seats: usize,
    max_steps: usize,
) -> Option<usize> {
    let config = SchedulerConfig {
        max_batched_tokens: 8,
        max_seqs: 2,
        watermark: 0.0,
        enable_prefix_cache: true,
        promote_after_steps,
        max_lower_tokens_with_foreground: usize::MAX,
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        session_seats,
        session_chunk_tokens: usize::MAX,
        session_step_budget: usize::MAX,
        decode_step_budget: usize::MAX,
    };
    let mut e = engine(32, config);
    let mut rng = Lcg(3);
    let bg = add(&mut e, rng.tokens(10), 4, low);
    for step in 0..max_steps {
        let fg_waiting = (e.scheduler.waiting.iter())
            .filter(|id| e.seqs[*id].priority == Priority::Foreground)
            .count();
        for _ in fg_waiting..3 {
            add(&mut e, rng.tokens(10), 6, Priority::Foreground);
        }
        for out in e.step().unwrap() {
            if out.finished.is_some() {
                e.take_finished(out.seq_id).unwrap();
                if out.seq_id == bg {
                    return Some(step);
                }
            }
        }
        e.check_invariants().unwrap();
    }
    None
}

#[test]
fn age_bound_serves_background_under_foreground_load() {
    // Without the bound the foreground queue never empties, so background never starts.
    assert_eq!(
        low_finish_step(Priority::Background, u64::MAX, 0, 300),
        None
    );
    let done = low_finish_step(Priority::Background, 20, 0, 300)
        .expect("background starved despite the bound");
    // Promoted once it has waited more than 20 steps, it takes the next free seat (a
    // foreground request holds one for about 8 steps) and needs about 4 more to finish.
    assert!(done > 20 && done <= 20 + 20, "finished at step {done}");
}

#[test]
fn session_seats_admit_ingest_at_once_under_saturating_foreground_load() {
    // Every foreground seat is taken and the foreground queue never empties; with no age
    // bound, session work still runs from its first step on its own seat, sharing the 8-token
    // budget with the foreground decodes and the prefill of each foreground arrival: a
    // 10-token prompt and 4 tokens out take a few steps (9 measured), never the 300.
    for low in [Priority::Ingest, Priority::Background] {
        assert_eq!(low_finish_step(low, u64::MAX, 0, 300), None);
        let done = low_finish_step(low, u64::MAX, 1, 300).expect("session work starved");
        assert!(done <= 12, "{low:?} finished at step {done}");
    }
}

#[test]
fn a_flash_evaluation_runs_alone_before_the_ingest_prefill_goes_on() {
    // A 200-token ingest prefill is under way in 32-token chunks when a flash evaluation
    // arrives: from the next step on the evaluation runs and the ingest prefill waits (no
    // tokens of it beside the evaluation), then resumes and finishes.
    let config = SchedulerConfig {
        max_batched_tokens: 32,
        max_seqs: 4,
        watermark: 0.0,
        enable_prefix_cache: true,
        promote_after_steps: u64::MAX,
        max_lower_tokens_with_foreground: usize::MAX,
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        session_seats: 2,
        session_chunk_tokens: usize::MAX,
        session_step_budget: usize::MAX,
        decode_step_budget: usize::MAX,
    };
    let mut e = engine(64, config);
    let mut rng = Lcg(5);
    let ingest = add(&mut e, rng.tokens(200), 1, Priority::Ingest);
    e.step().unwrap();
    let started = e.seqs[&ingest].num_computed_tokens;
    assert!(started > 0 && started < 200);
    let flash = add(&mut e, rng.tokens(10), 4, Priority::Flash);
    let mut flash_steps = 0;
    loop {
        let outs = e.step().unwrap();
        e.check_invariants().unwrap();
        flash_steps += 1;
        assert_eq!(
            e.seqs[&ingest].num_computed_tokens, started,
            "ingest ran beside flash"
        );
        if outs
            .iter()
            .any(|o| o.seq_id == flash && o.finished.is_some())
        {
            e.take_finished(flash).unwrap();
            break;
        }
        assert!(flash_steps < 20, "the flash evaluation never finished");
    }
    assert_eq!(
        flash_steps, 4,
        "one prefill step with its first token, then 3 decode steps"
    );
    for _ in 0..20 {
        e.step().unwrap();
        if e.take_finished(ingest).is_some() {
            return;
        }
    }
    panic!("the ingest prefill never resumed");
}

/// What `ModelRunner::prepare` does to the tables, without a model: reserve slots, mark the
/// tokens computed, commit the full blocks; a sequence that caught up gets a new token.
fn run_plan(plan: &StepPlan, seqs: &mut HashMap<SeqId, Sequence>) {
    for s in &plan.seqs {
        let seq = seqs.get_mut(&s.seq_id).unwrap();
        let table = seq.table.as_mut().unwrap();
        let end = seq.num_computed_tokens + s.num_tokens;
        if end > table.num_tokens() {
            let appended = table.append_slots(end - table.num_tokens()).unwrap();
            assert!(appended.copy.is_none());
        }
        seq.num_computed_tokens = end;
        table.commit_full_blocks(&seq.token_ids[..end]);
        if end == seq.num_tokens() {
            seq.token_ids.push(1000 + end as u32);
        }
    }
}

#[test]
fn preempted_sequence_readmits_from_its_committed_blocks() {
    let config = SchedulerConfig {
        max_batched_tokens: 64,
        max_seqs: 4,
        watermark: 0.0,
        enable_prefix_cache: true,
        promote_after_steps: 1000,
        max_lower_tokens_with_foreground: usize::MAX,
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        session_seats: 0,
        session_chunk_tokens: usize::MAX,
        session_step_budget: usize::MAX,
        decode_step_budget: usize::MAX,
    };
    let mut sched = Scheduler::new(config);
    let pool = SharedBlockPool::new(8, BLOCK);
    let mut seqs: HashMap<SeqId, Sequence> = HashMap::new();
    let new_seq = |id: SeqId, len: u32, priority: Priority| {
        let prompt = (0..len).map(|t| 100 * id as u32 + t).collect();
        let mut seq = Sequence::new(id, prompt, SamplingParams::default(), greedy(100));
        seq.priority = priority;
        seq
    };

    // A background sequence decodes until it holds 12 tokens, 11 computed: two full blocks
    // (one of them output) and a partial one.
    seqs.insert(1, new_seq(1, 6, Priority::Background));
    sched.add(1);
    while seqs[&1].num_tokens() < 12 {
        let plan = sched.schedule(&mut seqs, &pool);
        run_plan(&plan, &mut seqs);
    }
    assert_eq!(pool.borrow().num_used_blocks(), 3);

    // A foreground prompt needing 6 of the 5 free blocks preempts it and runs in this step.
    seqs.insert(2, new_seq(2, 22, Priority::Foreground));
    sched.add(2);
    let plan = sched.schedule(&mut seqs, &pool);
    let only_fg = vec![ScheduledSeq {
        seq_id: 2,
        num_tokens: 22,
    }];
    assert_eq!(
        (plan.seqs.clone(), plan.preempted.clone()),
        (only_fg, vec![1])
    );
    assert!(seqs[&1].table.is_none() && seqs[&1].status == SeqStatus::Waiting);
    run_plan(&plan, &mut seqs);

    // Once the foreground request goes, the victim's two full blocks are prefix hits,
    // output included: only the 4 tokens past them are recomputed.
    sched.remove(2);
    seqs.remove(&2);
    let plan = sched.schedule(&mut seqs, &pool);
    let rest = vec![ScheduledSeq {
        seq_id: 1,
        num_tokens: 4,
    }];
    assert_eq!(plan.seqs, rest);
    assert_eq!(seqs[&1].num_preemptions, 1);
    assert_eq!(
        seqs[&1].num_cached_tokens, 0,
        "cached tokens count at first admission"
    );
    run_plan(&plan, &mut seqs);
    let tables: Vec<_> = seqs.values().filter_map(|s| s.table.as_ref()).collect();
    pool.check_invariants(&tables).unwrap();
}

#[test]
fn lower_classes_get_a_small_share_of_steps_with_foreground_work() {
    // A long ingest prefill and a foreground request decoding: while the foreground request
    // is in the step, ingest advances at most `max_lower_tokens_with_foreground` tokens per
    // step (the step stays short); alone, it takes the whole budget.
    let config = SchedulerConfig {
        max_batched_tokens: 64,
        max_lower_tokens_with_foreground: 8,
        // The base share alone (the deadline has a test of its own).
        session_deadline_steps: 0,
        session_deadline_ms: 0,
        ..SchedulerConfig::default()
    };
    let mut e = engine(128, config);
    let mut rng = Lcg(3);
    let ingest = add(&mut e, rng.tokens(400), 1, Priority::Ingest);
    let fg = add(&mut e, rng.tokens(6), 20, Priority::Foreground);
    let mut with_fg = 0;
    let mut done_fg = false;
    for _ in 0..200 {
        let before = e.seqs.get(&ingest).map_or(0, |s| s.num_computed_tokens);
        let fg_live = e.seqs.contains_key(&fg) && !done_fg;
        for out in e.step().unwrap() {
            if out.finished.is_some() {
                done_fg |= out.seq_id == fg;
                e.take_finished(out.seq_id).unwrap();
            }
        }
        let Some(after) = e.seqs.get(&ingest).map(|s| s.num_computed_tokens) else {
            break;
        };
        let advanced = after - before;
        if fg_live {
            with_fg += 1;
            assert!(
                advanced <= 8,
                "ingest took {advanced} tokens of a foreground step"
            );
        } else {
            assert!(advanced >= 60, "alone, ingest took only {advanced} tokens");
        }
        e.check_invariants().unwrap();
    }
    assert!(done_fg && with_fg >= 20, "foreground ran {with_fg} steps");
}

#[test]
fn session_work_keeps_its_share_of_every_step_under_saturating_foreground_prefill() {
    // Foreground prompts of 200 tokens keep every step's budget full of prefill, and more keep
    // arriving. An ingest prefill still advances its full share (16 tokens) in every step from
    // its first, so it is resident within ceil(100 / 16) steps; Foreground plans from the
    // other 48 tokens meanwhile, and from the whole step again once no session work is due.
    let config = share_config(64, 0);
    let mut e = engine(512, config);
    let mut rng = Lcg(9);
    // Foreground prefill alone takes every token of the step.
    keep_foreground_prefilling(&mut e, &mut rng);
    e.step().unwrap();
    let computed = |e: &LlmEngine| -> usize {
        (e.seqs.values())
            .filter(|s| s.priority == Priority::Foreground)
            .map(|s| s.num_computed_tokens)
            .sum()
    };
    assert_eq!(computed(&e), 64, "foreground alone had the whole step");
    let ingest = add(&mut e, rng.tokens(100), 1, Priority::Ingest);
    let mut steps = 0;
    loop {
        keep_foreground_prefilling(&mut e, &mut rng);
        let before = e.seqs[&ingest].num_computed_tokens;
        let outs = e.step().unwrap();
        e.check_invariants().unwrap();
        steps += 1;
        for out in &outs {
            if out.finished.is_some() && out.seq_id != ingest {
                e.take_finished(out.seq_id).unwrap();
            }
        }
        if e.take_finished(ingest).is_some() {
            break;
        }
        let advanced = e.seqs[&ingest].num_computed_tokens - before;
        assert_eq!(
            advanced, 16,
            "step {steps}: ingest advanced {advanced} tokens"
        );
        assert!(steps < 20, "the ingest prefill never finished");
    }
    assert_eq!(steps, 7, "100 tokens at 16 a step");
    assert_eq!(e.scheduler.num_promotions, 0, "no age bound needed");
}

/// Four seats, two session seats, no age bound, a base session share of 16 tokens.
fn share_config(max_batched_tokens: usize, session_deadline_steps: u64) -> SchedulerConfig {
    SchedulerConfig {
        max_batched_tokens,
        max_seqs: 4,
        watermark: 0.0,
        promote_after_steps: u64::MAX,
        max_lower_tokens_with_foreground: 16,
        session_deadline_steps,
        session_seats: 2,
        ..SchedulerConfig::default()
    }
}

/// Foreground prompts of 200 tokens, two always waiting: every step's budget fills with
/// foreground prefill unless something holds tokens back.
fn keep_foreground_prefilling(e: &mut LlmEngine, rng: &mut Lcg) {
    let fg_waiting = (e.scheduler.waiting.iter())
        .filter(|id| e.seqs[*id].priority == Priority::Foreground)
        .count();
    for _ in fg_waiting..2 {
        add(e, rng.tokens(200), 2, Priority::Foreground);
    }
}

/// Steps the engine once, dropping every finished sequence but `keep`; whether `keep` ended.
/// Tokens the engine's last step computed, prefill and decode.
fn last_step_tokens(e: &LlmEngine) -> usize {
    e.last_step.num_prefill_tokens + e.last_step.num_decode_tokens
}

fn step_keeping(e: &mut LlmEngine, keep: &[SeqId]) -> Vec<SeqId> {
    let outs = e.step().unwrap();
    e.check_invariants().unwrap();
    let mut ended = Vec::new();
    for out in &outs {
        if out.finished.is_some() {
            if keep.contains(&out.seq_id) {
                ended.push(out.seq_id);
            } else {
                e.take_finished(out.seq_id).unwrap();
            }
        }
    }
    ended
}

#[test]
fn the_session_share_grows_to_land_ingest_within_its_deadline_up_to_half_a_step() {
    // Base share 16 of a 128-token step, a deadline of 4 steps: a 160-token ingest prefill
    // takes 40 tokens a step and is done in 4; a 40-token one needs less than the base and
    // takes 16 a step; a 600-token one is held to half the step (64) until its deadline, then
    // takes all but a token for each running client request (one runs here: 127).
    let config = share_config(128, 4);
    for (tokens, expected) in [
        (160, vec![40, 40, 40, 40]),
        (40, vec![16, 16, 8]),
        (600, vec![64, 64, 64, 64, 127, 127]),
    ] {
        let mut e = engine(1024, config.clone());
        let mut rng = Lcg(21);
        keep_foreground_prefilling(&mut e, &mut rng);
        e.step().unwrap();
        let ingest = add(&mut e, rng.tokens(tokens), 1, Priority::Ingest);
        let mut advances = Vec::new();
        for _ in 0..expected.len() {
            keep_foreground_prefilling(&mut e, &mut rng);
            let before = e.seqs[&ingest].num_computed_tokens;
            step_keeping(&mut e, &[ingest]);
            advances.push(e.seqs[&ingest].num_computed_tokens - before);
        }
        assert_eq!(advances, expected, "a {tokens}-token ingest prefill");
    }
}

#[test]
fn beside_client_requests_ingest_keeps_its_share_while_a_flash_evaluation_runs() {
    // Alone with ingest, a flash evaluation runs without it (see above); beside client
    // requests, the evaluation takes what it needs of the session share and the ingest
    // prefill the rest, so the data plane never stops for an evaluation decoding at the
    // clients' pace.
    let config = share_config(64, 0);
    let mut e = engine(1024, config);
    let mut rng = Lcg(23);
    keep_foreground_prefilling(&mut e, &mut rng);
    let ingest = add(&mut e, rng.tokens(300), 1, Priority::Ingest);
    e.step().unwrap();
    let flash = add(&mut e, rng.tokens(10), 6, Priority::Flash);
    let mut flash_done = false;
    for step in 0..12 {
        keep_foreground_prefilling(&mut e, &mut rng);
        let before = e.seqs[&ingest].num_computed_tokens;
        let flash_before = e.seqs.get(&flash).map(|s| s.num_computed_tokens);
        let ended = step_keeping(&mut e, &[ingest, flash]);
        if ended.contains(&flash) {
            e.take_finished(flash).unwrap();
            flash_done = true;
        }
        let flash_took = match (flash_before, e.seqs.get(&flash)) {
            (Some(b), Some(s)) => s.num_computed_tokens - b,
            (Some(_), None) => 1, // its last decode
            _ => 0,
        };
        let advanced = e.seqs[&ingest].num_computed_tokens - before;
        assert_eq!(
            advanced + flash_took,
            16,
            "step {step}: ingest {advanced}, flash {flash_took}"
        );
        assert!(
            advanced > 0,
            "step {step}: ingest stopped for the evaluation"
        );
    }
    assert!(flash_done, "the flash evaluation never finished");
}

#[test]
fn the_session_share_is_never_more_than_the_session_work_can_use() {
    // A flash evaluation decoding beside saturating client prefill needs one token a step:
    // that is all it keeps back, and Foreground plans from the other 63.
    let mut e = engine(1024, share_config(64, 4));
    let mut rng = Lcg(29);
    let flash = add(&mut e, rng.tokens(8), 6, Priority::Flash);
    keep_foreground_prefilling(&mut e, &mut rng);
    step_keeping(&mut e, &[flash]);
    for step in 1..5 {
        keep_foreground_prefilling(&mut e, &mut rng);
        let before = e.seqs[&flash].num_computed_tokens;
        assert!(step_keeping(&mut e, &[flash]).is_empty());
        let all = last_step_tokens(&e);
        assert_eq!(
            e.seqs[&flash].num_computed_tokens - before,
            1,
            "step {step}"
        );
        assert_eq!(all, 64, "step {step}: the step is full");
    }
}

#[test]
fn while_session_work_is_due_the_whole_step_is_held_to_the_session_step_budget() {
    // Steps of 128 tokens, 64 while session work is due: foreground prefill fills whole
    // steps, an ingest prefill of 100 tokens arrives, and until it is resident no step
    // computes more than 64 tokens (the ingest gets at least its base share of them); then
    // steps are whole again.
    let config = SchedulerConfig {
        session_step_budget: 64,
        ..share_config(128, 0)
    };
    let mut e = engine(1024, config);
    let mut rng = Lcg(31);
    let step_tokens = |e: &mut LlmEngine, rng: &mut Lcg, keep: &[SeqId]| {
        keep_foreground_prefilling(e, rng);
        let ended = step_keeping(e, keep);
        (last_step_tokens(e), ended)
    };
    let (full, _) = step_tokens(&mut e, &mut rng, &[]);
    assert_eq!(full, 128, "foreground alone had the whole step");
    let ingest = add(&mut e, rng.tokens(100), 1, Priority::Ingest);
    let mut steps = 0;
    loop {
        let before = e.seqs[&ingest].num_computed_tokens;
        let (tokens, ended) = step_tokens(&mut e, &mut rng, &[ingest]);
        steps += 1;
        assert!(
            tokens <= 64,
            "step {steps} computed {tokens} tokens with ingest due"
        );
        if ended.contains(&ingest) {
            break;
        }
        let advanced = e.seqs[&ingest].num_computed_tokens - before;
        assert!(advanced >= 16, "step {steps}: ingest advanced {advanced}");
        assert!(steps < 10, "the ingest prefill never finished");
    }
    e.take_finished(ingest).unwrap();
    let (full, _) = step_tokens(&mut e, &mut rng, &[]);
    assert_eq!(full, 128, "without session work the step is whole again");
}

#[test]
fn while_a_request_decodes_the_whole_step_is_held_to_the_decode_step_budget() {
    // Steps of 128 tokens, 48 while anything decodes: a 300-token prompt alone prefills in
    // whole steps; once a short request decodes beside a second long prompt, no step computes
    // more than 48 tokens, and the decoding request gets its token in every one of them.
    let config = SchedulerConfig {
        decode_step_budget: 48,
        ..share_config(128, 0)
    };
    let mut e = engine(1024, config);
    let mut rng = Lcg(43);
    let alone = add(&mut e, rng.tokens(300), 1, Priority::Foreground);
    step_keeping(&mut e, &[alone]);
    assert_eq!(
        last_step_tokens(&e),
        128,
        "a prompt with nothing decoding had the whole step"
    );
    while !step_keeping(&mut e, &[alone]).contains(&alone) {}
    e.take_finished(alone).unwrap();

    let chat = add(&mut e, rng.tokens(20), 12, Priority::Foreground);
    step_keeping(&mut e, &[chat]);
    let long = add(&mut e, rng.tokens(300), 1, Priority::Foreground);
    let mut steps = 0;
    loop {
        let before = e.seqs[&chat].output_ids().len();
        let ended = step_keeping(&mut e, &[chat, long]);
        steps += 1;
        assert!(
            last_step_tokens(&e) <= 48,
            "step {steps}: {} tokens beside a decode",
            last_step_tokens(&e)
        );
        if ended.contains(&chat) {
            break;
        }
        assert!(
            e.seqs[&chat].output_ids().len() > before,
            "step {steps}: no token"
        );
        assert!(steps < 20, "the decoding request never finished");
    }
    e.take_finished(chat).unwrap();
    assert!(
        e.seqs[&long].num_computed_tokens > 0,
        "the long prompt advanced beside it"
    );
}

/// A speculative draft never costs another sequence its blocks: when the draft's blocks are
/// not there, the draft is dropped and the sequence decodes its one token.
#[test]
fn a_draft_is_dropped_before_anyone_is_preempted_for_its_blocks() {
    let config = SchedulerConfig {
        max_batched_tokens: 64,
        watermark: 0.0,
        session_seats: 0,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config);
    let pool = SharedBlockPool::new(4, BLOCK);
    let mut seqs: HashMap<SeqId, Sequence> = HashMap::new();
    // Two sequences of 7 prompt tokens: two blocks each, the whole pool, once prefilled.
    for id in [1, 2] {
        let prompt = (0..7).map(|t| 10 * id as u32 + t).collect();
        seqs.insert(
            id,
            Sequence::new(id, prompt, SamplingParams::default(), greedy(100)),
        );
        sched.add(id);
    }
    let plan = sched.schedule(&mut seqs, &pool);
    run_plan(&plan, &mut seqs);
    assert_eq!(pool.borrow().num_free_blocks(), 0);
    // Each now has 8 tokens, 7 computed: the next token fits its second block, a draft of 3
    // would need a third.
    seqs.get_mut(&2).unwrap().draft = vec![5, 6, 7];
    let plan = sched.schedule(&mut seqs, &pool);
    assert!(plan.preempted.is_empty(), "{:?}", plan.preempted);
    let planned: Vec<(SeqId, usize)> = plan.seqs.iter().map(|s| (s.seq_id, s.num_tokens)).collect();
    assert_eq!(planned, [(1, 1), (2, 1)]);
    assert!(seqs[&2].draft.is_empty());
}
