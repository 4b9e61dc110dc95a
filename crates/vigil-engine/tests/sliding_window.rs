//! Sliding-window KV release on the tiny Gemma 3 (window 8, three local layers and one
//! global): long generations, chunked prefill, speculative rollback, prefix hits, pin forks,
//! shifts and restores give exactly what an engine keeping every block's KV gives, blocks slid
//! past do lose their local-layer KV (and its pages), and the block accounting stays exact.

mod common;

use common::{greedy, stop};

use std::path::Path;
use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::pins::{PinSave, PinUse};
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{Priority, SeqId};
use vigil_engine::speculative::SpecMethod;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::LoadOptions;

const WINDOW: usize = 8;

/// The tiny Gemma 3 behind an engine of `num_blocks` f32 blocks of `block` tokens, giving
/// back slid-past local KV or not.
fn gemma(num_blocks: usize, block: usize, release: bool, config: SchedulerConfig) -> LlmEngine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gemma3");
    let opts = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    let model = vigil_model::load::load(&dir, &opts).unwrap().model;
    let c = &model.config;
    let kv = KvCache::new(c.num_layers, c.kv_shape(), num_blocks, block, KvDtype::F32);
    let mut e = LlmEngine::new(ModelRunner::new(model, kv), config);
    assert_eq!(e.pool.borrow().local_window(), Some(WINDOW));
    assert!(e.set_local_kv_release(release));
    e
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|k| 3 + (seed * 31 + k * 17 + k * k * seed) % 300)
        .collect()
}

fn pin(key: u64, save: Option<PinSave>) -> Option<PinUse> {
    Some(PinUse {
        key,
        save,
        save_on_abort: false,
    })
}

/// Each finished sequence's (token, logprob bits) in order, and its prompt tokens found
/// cached.
type Outcome = (Vec<(u32, u32)>, usize);

/// Step until every sequence in `ids` finishes, checking the invariant each step; records
/// the most blocks with released local KV seen at once.
fn run_all(e: &mut LlmEngine, ids: &[SeqId], most_released: &mut usize) -> Vec<Outcome> {
    let mut out: Vec<Vec<(u32, u32)>> = vec![Vec::new(); ids.len()];
    let mut cached = vec![usize::MAX; ids.len()];
    for _ in 0..20_000 {
        for t in e.step().unwrap() {
            if let Some(i) = ids.iter().position(|&id| id == t.seq_id) {
                out[i].push((t.token, t.logprob.to_bits()));
            }
        }
        e.check_invariants().unwrap();
        *most_released = (*most_released).max(e.pool.borrow().num_local_released_blocks());
        for (i, &id) in ids.iter().enumerate() {
            if let Some(seq) = e.take_finished(id) {
                cached[i] = seq.num_cached_tokens;
            }
        }
        if cached.iter().all(|&c| c != usize::MAX) {
            return out.into_iter().zip(cached).collect();
        }
    }
    panic!("sequences never finished");
}

fn all_free(e: &mut LlmEngine) {
    let keys: Vec<u64> = e.pins.kv_tokens().map(|(k, _)| k).collect();
    for k in keys {
        e.pins.remove(k);
    }
    e.check_invariants().unwrap();
    let p = e.pool.borrow();
    assert_eq!(p.num_free_blocks(), p.num_blocks());
}

/// A workload of concurrent long generations under a small step budget (chunked prefill,
/// shared prompts, speculative drafts), on `e`; each sequence's outcome.
fn workload(e: &mut LlmEngine, most_released: &mut usize) -> Vec<Outcome> {
    e.spec.max_draft = 4;
    let shared = tokens(1, 29);
    let mut ids = Vec::new();
    for s in 0..4u32 {
        let mut prompt = if s % 2 == 0 {
            shared.clone()
        } else {
            Vec::new()
        };
        prompt.extend(tokens(s + 2, 11 + 7 * s as usize));
        let mut params = greedy();
        if s == 3 {
            // Drafts from the prompt lookup: some accepted, most rolled back.
            params.speculative.method = Some(SpecMethod::Ngram);
        }
        ids.push(e.add_request(prompt, params, stop(70 + 5 * s as usize)));
    }
    let out = run_all(e, &ids, most_released);
    assert!(e.spec_stats.drafts > 0, "no draft was verified");
    out
}

fn small_steps() -> SchedulerConfig {
    SchedulerConfig {
        max_batched_tokens: 13,
        ..SchedulerConfig::default()
    }
}

#[test]
fn long_generations_match_an_engine_keeping_every_block() {
    for block in [4, 32] {
        let (mut on, mut off) = (
            gemma(256, block, true, small_steps()),
            gemma(256, block, false, small_steps()),
        );
        let (mut released, mut never) = (0, 0);
        let a = workload(&mut on, &mut released);
        let b = workload(&mut off, &mut never);
        // The same tokens and log-probs. (Prefix hits may differ: a sequence admitted after
        // another with its prompt slid past that prompt finds no usable hit.)
        let outputs = |o: &[Outcome]| o.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
        assert_eq!(outputs(&a), outputs(&b), "block size {block}");
        assert!(
            released >= if block == 4 { 20 } else { 2 },
            "block size {block}: {released} blocks released"
        );
        assert_eq!(never, 0);
        all_free(&mut on);
        all_free(&mut off);
    }
}

#[test]
fn released_pages_leave_memory() {
    // 32 f32 rows of 32 = one 4 KiB page per block and layer.
    let (mut on, mut off) = (
        gemma(64, 32, true, SchedulerConfig::default()),
        gemma(64, 32, false, SchedulerConfig::default()),
    );
    let mut held = Vec::new();
    for e in [&mut on, &mut off] {
        let id = e.add_request(tokens(3, 40), greedy(), stop(150));
        let mut r = 0;
        run_all(e, &[id], &mut r);
        held.push(e.runner.kv.resident_bytes());
    }
    let (Some(on_bytes), Some(off_bytes)) = (&held[0], &held[1]) else {
        return; // No `mincore` here.
    };
    // 190 tokens: 6 blocks. The window (8) reads block 5 only; block 1 is kept for a query
    // at the prompt's end (40); blocks 0, 2, 3 and 4 are released in the local layers.
    let layer_block = 2 * 32 * 32 * 4;
    assert_eq!(off_bytes, &vec![6 * layer_block; 4]);
    let local = 2 * layer_block;
    assert_eq!(on_bytes, &vec![local, local, local, 6 * layer_block]);
}

#[test]
fn prefix_hits_after_release_match_and_stop_at_usable_kv() {
    let mut outcomes = Vec::new();
    for release in [true, false] {
        let mut e = gemma(256, 4, release, SchedulerConfig::default());
        let mut r = 0;
        let prompt = tokens(5, 30);
        let first = e.add_request(prompt.clone(), greedy(), stop(50));
        let (out, _) = run_all(&mut e, &[first], &mut r).remove(0);
        // The whole history again: its tail still has local KV, so nearly all of it hits.
        let mut again = prompt.clone();
        again.extend(out.iter().map(|&(t, _)| t));
        again.extend(tokens(6, 5));
        // Only the start of the prompt: slid past, so no hit with release on.
        let mut early = prompt[..16].to_vec();
        early.extend(tokens(7, 9));
        let ids = [
            e.add_request(again, greedy(), stop(20)),
            e.add_request(early, greedy(), stop(20)),
            // The same prompt again: what a query at its end reads was kept.
            e.add_request(prompt, greedy(), stop(20)),
        ];
        outcomes.push(run_all(&mut e, &ids, &mut r));
        all_free(&mut e);
    }
    let (on, off) = (&outcomes[0], &outcomes[1]);
    for i in 0..3 {
        assert_eq!(on[i].0, off[i].0, "sequence {i}");
    }
    assert_eq!(on[0].1, off[0].1, "the history's hit is whole");
    assert_eq!((on[1].1, off[1].1), (0, 16));
    assert_eq!((on[2].1, off[2].1), (28, 28));
}

/// A session on pin 1: a long first turn saved whole, then turns forked from it (the whole
/// history, and a rewrite from early on), a prompt-only pin after a long reply, a shift, and
/// the pin read out and restored into a fresh engine. Outcomes and cached counts per turn.
fn session(release: bool) -> Vec<Outcome> {
    let mut e = gemma(256, 4, release, SchedulerConfig::default());
    let mut r = 0;
    let mut all = Vec::new();
    let opening = tokens(8, 21);
    let id = e.add_sequence(
        opening.clone(),
        greedy(),
        stop(40),
        Priority::Foreground,
        pin(1, Some(PinSave::All)),
    );
    all.extend(run_all(&mut e, &[id], &mut r));
    let history = e.pins.get(1).map(|p| p.tokens.clone()).unwrap();
    let mut next = history.clone();
    next.extend(tokens(9, 6));
    let mut rewrite = opening[..10].to_vec();
    rewrite.extend(tokens(10, 12));
    let ids = [
        e.add_sequence(next, greedy(), stop(15), Priority::Foreground, pin(1, None)),
        e.add_sequence(
            rewrite,
            greedy(),
            stop(15),
            Priority::Foreground,
            pin(1, None),
        ),
    ];
    all.extend(run_all(&mut e, &ids, &mut r));

    // A prompt-only pin keeps what continuing its prompt reads, however long the reply.
    let prompt = tokens(11, 26);
    let id = e.add_sequence(
        prompt.clone(),
        greedy(),
        stop(40),
        Priority::Ingest,
        pin(2, Some(PinSave::Prompt)),
    );
    all.extend(run_all(&mut e, &[id], &mut r));
    let mut more = prompt.clone();
    more.extend(tokens(12, 4));
    let id = e.add_sequence(more, greedy(), stop(10), Priority::Foreground, pin(2, None));
    all.extend(run_all(&mut e, &[id], &mut r));

    // The pin read out and restored elsewhere: the whole history serves; a rewrite from early
    // on recomputes where local KV is gone.
    let kv = e.read_pin(1).unwrap();
    assert_eq!(kv.local_from > 0, release);
    let mut b = gemma(256, 4, release, SchedulerConfig::default());
    assert!(b.write_pin(1, kv, true));
    let mut next = history.clone();
    next.extend(tokens(13, 5));
    let mut rewrite = history[..14].to_vec();
    rewrite.extend(tokens(14, 3));
    let ids = [
        b.add_sequence(next, greedy(), stop(12), Priority::Foreground, pin(1, None)),
        b.add_sequence(
            rewrite,
            greedy(),
            stop(12),
            Priority::Foreground,
            pin(1, None),
        ),
    ];
    all.extend(run_all(&mut b, &ids, &mut r));

    // An ingest leaves KV for every token of the pin; a shift keeping the opening and the
    // last 24 tokens: the next query reads only moved rows, all with local KV.
    let mut ingest = history.clone();
    ingest.extend(tokens(16, 8));
    let id = e.add_sequence(
        ingest,
        greedy(),
        stop(1),
        Priority::Ingest,
        pin(1, Some(PinSave::Prompt)),
    );
    all.extend(run_all(&mut e, &[id], &mut r));
    let n = e.pins.get(1).map(|p| p.tokens.len()).unwrap();
    assert!(e.shift_pin(1, 4, n - 28));
    let mut next = e.pins.get(1).map(|p| p.tokens.clone()).unwrap();
    next.extend(tokens(15, 3));
    let id = e.add_sequence(next, greedy(), stop(12), Priority::Foreground, pin(1, None));
    all.extend(run_all(&mut e, &[id], &mut r));
    // Keeping 12 opening tokens and 2 more: the next query reads the opening, slid past.
    let n = e.pins.get(1).map(|p| p.tokens.len()).unwrap();
    assert_eq!(e.shift_pin(1, 12, n - 14), !release);
    assert_eq!(r > 0, release);
    all_free(&mut e);
    all_free(&mut b);
    all
}

#[test]
fn sessions_forks_shifts_and_restores_match() {
    let (on, off) = (session(true), session(false));
    assert_eq!(on.len(), off.len());
    for (i, (a, b)) in on.iter().zip(&off).enumerate() {
        assert_eq!(a.0, b.0, "turn {i}");
    }
    let cached = |o: &[Outcome]| o.iter().map(|x| x.1).collect::<Vec<_>>();
    let (on, off) = (cached(&on), cached(&off));
    // The whole-history forks, the prompt pin's continuation, the restored history and the
    // shifted pin are served alike; the rewrites from early on are recomputed with release on.
    for i in [1, 4, 5, 7, 8] {
        assert_eq!(on[i], off[i], "turn {i}: {on:?} vs {off:?}");
    }
    assert!(on[2] < off[2] && on[6] < off[6], "{on:?} vs {off:?}");
}
