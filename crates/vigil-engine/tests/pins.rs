//! Session pins on a real (tiny) model: a request forked from a pin computes only its new
//! tokens and produces exactly what the same prompt produces from scratch; saving, aborting
//! with save, eviction under pressure and removal keep the block accounting exact.

mod common;

use common::{greedy, stop};

use vigil_engine::engine::LlmEngine;
use vigil_engine::pins::{PinSave, PinUse};
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{Priority, SeqId};

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|k| 3 + (seed * 31 + k * 17) % 90)
        .collect()
}

/// Step until `id` finishes, checking the invariant every step; returns its output and the
/// prompt tokens it found cached.
fn run(engine: &mut LlmEngine, id: SeqId) -> (Vec<u32>, usize) {
    for _ in 0..10_000 {
        engine.step().unwrap();
        engine.check_invariants().unwrap();
        if let Some(seq) = engine.take_finished(id) {
            return (seq.output_ids().to_vec(), seq.num_cached_tokens);
        }
    }
    panic!("sequence {id} never finished");
}

fn pin(key: u64, save: Option<PinSave>) -> Option<PinUse> {
    Some(PinUse {
        key,
        save,
        save_on_abort: false,
    })
}

fn engine(num_blocks: usize) -> LlmEngine {
    common::tiny_engine(num_blocks, SchedulerConfig::default(), 1)
}

#[test]
fn a_fork_of_the_pin_reuses_its_kv_and_matches_a_cold_run() {
    let mut e = engine(128);
    let data = tokens(1, 37);
    let id = e.add_sequence(
        data.clone(),
        greedy(),
        stop(1),
        Priority::Ingest,
        pin(7, Some(PinSave::Prompt)),
    );
    run(&mut e, id);
    assert_eq!(e.pins.get(7).map(|p| p.num_kv_tokens()), Some(37));

    let mut prompt = data.clone();
    prompt.extend(tokens(2, 9));
    let id = e.add_sequence(
        prompt.clone(),
        greedy(),
        stop(12),
        Priority::Foreground,
        pin(7, None),
    );
    let (on_pin, cached) = run(&mut e, id);
    assert_eq!(cached, 37, "the whole pinned prefix is reused");

    let mut cold = engine(128);
    let id = cold.add_request(prompt, greedy(), stop(12));
    let (cold_out, cold_cached) = run(&mut cold, id);
    assert_eq!(cold_cached, 0);
    assert_eq!(on_pin, cold_out);
    // The generate did not touch the pin.
    assert_eq!(e.pins.get(7).map(|p| p.tokens.len()), Some(37));
}

#[test]
fn saving_all_keeps_the_reply_and_the_next_turn_resumes_from_it() {
    let mut e = engine(128);
    let turn1 = tokens(3, 20);
    let id = e.add_sequence(
        turn1.clone(),
        greedy(),
        stop(6),
        Priority::Foreground,
        pin(1, Some(PinSave::All)),
    );
    let (reply, _) = run(&mut e, id);
    let held = e.pins.get(1).map(|p| (p.tokens.len(), p.num_kv_tokens()));
    // The last sampled token has no KV yet.
    assert_eq!(held, Some((26, 25)));

    let mut turn2 = turn1.clone();
    turn2.extend(&reply);
    turn2.extend(tokens(4, 5));
    let id = e.add_sequence(
        turn2.clone(),
        greedy(),
        stop(4),
        Priority::Foreground,
        pin(1, Some(PinSave::All)),
    );
    let (out2, cached) = run(&mut e, id);
    assert_eq!(cached, 25);
    let mut cold = engine(128);
    let id = cold.add_request(turn2, greedy(), stop(4));
    assert_eq!(run(&mut cold, id).0, out2);

    // A diverging turn keeps only the common prefix.
    let mut other = turn1[..10].to_vec();
    other.extend(tokens(9, 6));
    let id = e.add_sequence(
        other,
        greedy(),
        stop(2),
        Priority::Foreground,
        pin(1, Some(PinSave::All)),
    );
    assert_eq!(run(&mut e, id).1, 10);
    assert_eq!(e.pins.get(1).map(|p| p.tokens.len()), Some(18));

    e.pins.remove(1);
    e.check_invariants().unwrap();
    assert_eq!(
        e.pool.borrow().num_used_blocks(),
        0,
        "removing the pin frees every block"
    );
}

#[test]
fn abort_with_save_keeps_what_was_computed() {
    let mut e = engine(128);
    let config = SchedulerConfig {
        max_batched_tokens: 8,
        ..SchedulerConfig::default()
    };
    e.scheduler.config = config;
    let prompt = tokens(5, 40);
    let use_ = PinUse {
        key: 3,
        save: Some(PinSave::Prompt),
        save_on_abort: true,
    };
    let id = e.add_sequence(
        prompt.clone(),
        greedy(),
        stop(1),
        Priority::Background,
        Some(use_),
    );
    e.step().unwrap();
    e.step().unwrap();
    e.abort(id);
    e.check_invariants().unwrap();
    let held = e.pins.get(3).map(|p| (p.tokens.len(), p.num_kv_tokens()));
    assert_eq!(
        held,
        Some((40, 16)),
        "two 8-token chunks were computed and kept"
    );
    let id = e.add_sequence(
        prompt,
        greedy(),
        stop(1),
        Priority::Foreground,
        pin(3, None),
    );
    assert_eq!(run(&mut e, id).1, 16);
}

#[test]
fn idle_pins_give_their_blocks_back_under_pressure() {
    // 24 blocks of 4 tokens; each pin holds 10 blocks.
    let mut e = engine(24);
    for key in 1..=2u64 {
        let id = e.add_sequence(
            tokens(key as u32, 40),
            greedy(),
            stop(1),
            Priority::Ingest,
            pin(key, Some(PinSave::Prompt)),
        );
        run(&mut e, id);
    }
    assert!(e.pool.borrow().num_free_blocks() < 10);
    // A request needing more than what is free must still run: an idle pin yields.
    let id = e.add_request(tokens(11, 50), greedy(), stop(3));
    let (out, _) = run(&mut e, id);
    assert_eq!(out.len(), 3);
    assert!(e.pins.num_evictions >= 1);
    // A pin that lost its table still serves (recomputing from its tokens).
    let mut prompt = tokens(1, 40);
    prompt.push(5);
    let id = e.add_sequence(
        prompt,
        greedy(),
        stop(2),
        Priority::Foreground,
        pin(1, None),
    );
    assert_eq!(run(&mut e, id).0.len(), 2);
    e.pins.remove(1);
    e.pins.remove(2);
    e.check_invariants().unwrap();
    assert_eq!(e.pool.borrow().num_used_blocks(), 0);
}

#[test]
fn pin_churn_keeps_the_block_accounting_exact() {
    for seed in [5, 7, 11, 13] {
        pin_churn(seed);
    }
}

fn pin_churn(seed: u64) {
    // Four sessions on a 40-block pool: ingests extend a pin, turns save their replies,
    // queries fork without saving, warm-like requests are aborted with save, pins are dropped
    // and re-created, and idle pins are evicted under pressure. The invariant holds after
    // every step and nothing is left once the pins are gone.
    let config = SchedulerConfig {
        max_batched_tokens: 16,
        max_seqs: 6,
        watermark: 0.0,
        ..SchedulerConfig::default()
    };
    let mut e = common::tiny_engine(40, config, 1);
    let mut rng = common::Lcg(seed);
    let mut mirrors: Vec<Vec<u32>> = vec![Vec::new(); 4];
    let mut live: Vec<(SeqId, u64)> = Vec::new();
    let (mut forked_hits, mut saves) = (0usize, 0usize);
    for step in 0..3000 {
        if step < 2800 && rng.next(3) == 0 {
            let key = rng.next(4);
            let m = &mut mirrors[key as usize];
            if m.len() > 60 {
                m.clear();
                e.pins.remove(key);
            }
            let kind = rng.next(4);
            let mut prompt = m.clone();
            prompt.extend(tokens(step as u32, 2 + rng.next(8) as usize));
            let (save, max, on_abort) = match kind {
                0 => (Some(PinSave::Prompt), 1, false),
                1 => (Some(PinSave::All), 1 + rng.next(4) as usize, false),
                2 => (None, 1 + rng.next(6) as usize, false),
                _ => (Some(PinSave::Prompt), 1, true),
            };
            if save.is_some() {
                *m = prompt.clone();
            }
            let use_ = PinUse {
                key,
                save,
                save_on_abort: on_abort,
            };
            let id = e.add_sequence(prompt, greedy(), stop(max), Priority::Ingest, Some(use_));
            live.push((id, key));
        }
        if rng.next(15) == 0 && !live.is_empty() {
            let (id, _) = live.remove(rng.next(live.len() as u64) as usize);
            e.abort(id);
        }
        e.step().unwrap();
        e.check_invariants()
            .unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
        live.retain(|&(id, _)| match e.take_finished(id) {
            Some(seq) => {
                forked_hits += usize::from(seq.num_cached_tokens > 0);
                saves += usize::from(seq.pin.is_some_and(|p| p.save.is_some()));
                false
            }
            None => true,
        });
    }
    assert!(live.is_empty() && !e.has_work(), "work left behind");
    assert!(
        forked_hits > 100,
        "requests rarely started from a pin ({forked_hits})"
    );
    assert!(
        saves > 100 && e.pins.num_evictions > 0,
        "{saves} saves, {} evictions",
        e.pins.num_evictions
    );
    for key in 0..4 {
        e.pins.remove(key);
    }
    e.check_invariants().unwrap();
    assert_eq!(e.pool.borrow().num_used_blocks(), 0, "blocks leaked");
}

/// A pin's KV copied out of one engine and loaded into a fresh one (as a restart reads it back
/// from disk) serves a fork exactly as the original does: only the new tokens are computed,
/// the output is identical, and the blocks it takes are accounted for.
#[test]
fn a_pin_read_out_and_written_into_another_engine_serves_forks_identically() {
    let mut a = engine(128);
    let data = tokens(3, 41);
    let id = a.add_sequence(
        data.clone(),
        greedy(),
        stop(1),
        Priority::Ingest,
        pin(5, Some(PinSave::Prompt)),
    );
    run(&mut a, id);
    let kv = a.read_pin(5).expect("the pin holds KV");
    assert_eq!(kv.tokens, data);
    assert!(a.read_pin(6).is_none());

    let mut b = engine(128);
    assert!(b.write_pin(9, kv.clone(), true));
    b.check_invariants().unwrap();
    assert_eq!(b.pins.get(9).map(|p| p.num_kv_tokens()), Some(data.len()));
    assert!(
        !b.write_pin(9, kv.clone(), true),
        "a pin that holds KV is not overwritten"
    );
    assert_eq!(
        b.read_pin(9).as_ref(),
        Some(&kv),
        "the rows read back are the rows written"
    );

    let mut prompt = data.clone();
    prompt.extend(tokens(4, 7));
    let ask = |e: &mut LlmEngine, key| {
        let id = e.add_sequence(
            prompt.clone(),
            greedy(),
            stop(10),
            Priority::Foreground,
            pin(key, None),
        );
        run(e, id)
    };
    let (out_a, cached_a) = ask(&mut a, 5);
    let (out_b, cached_b) = ask(&mut b, 9);
    assert_eq!(out_a, out_b);
    assert_eq!((cached_a, cached_b), (data.len(), data.len()));
    // A mismatched shape is refused.
    let mut bad = kv.clone();
    bad.rows.pop();
    assert!(!engine(128).write_pin(1, bad, true));
    b.pins.remove(9);
    b.check_invariants().unwrap();
}

/// Truncated KV is the KV of the shorter prompt.
#[test]
fn a_pin_kv_truncated_equals_the_pin_of_the_shorter_prompt() {
    let mut e = engine(128);
    let data = tokens(5, 30);
    for (key, n) in [(1, 30), (2, 19)] {
        let id = e.add_sequence(
            data[..n].to_vec(),
            greedy(),
            stop(1),
            Priority::Ingest,
            pin(key, Some(PinSave::Prompt)),
        );
        run(&mut e, id);
    }
    let mut long = e.read_pin(1).unwrap();
    long.truncate(19);
    assert_eq!(Some(long), e.read_pin(2));
}
