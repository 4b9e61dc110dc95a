//! Scoring prompt rows (`SamplingParams::score_prompt_from`) on a real (tiny) model: the pick
//! after each scored row is exactly the token, with exactly the log-probabilities, a greedy
//! decode produces at that position, whether the rows run in one chunk or several and beside
//! other sequences. This is what lets a flash evaluation verify its previous answer as a
//! draft in one pass and still answer exactly as a cold decode.

mod common;

use vigil_engine::engine::LlmEngine;
use vigil_engine::sampling::{SampleOutput, SamplingParams};
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{Priority, SeqId, StopCriteria};

fn stop(max_tokens: usize) -> StopCriteria {
    StopCriteria {
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

fn greedy(score_prompt_from: Option<usize>) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        logprobs: Some(3),
        score_prompt_from,
        ..SamplingParams::default()
    }
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|k| 3 + (seed * 31 + k * 17) % 90)
        .collect()
}

/// A generated token and its top log-probabilities.
type Token = (u32, Vec<(u32, f32)>);

/// Step until `id` finishes; its generated tokens and its prompt scores.
fn run(engine: &mut LlmEngine, id: SeqId) -> (Vec<Token>, Vec<SampleOutput>) {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        for t in engine.step().unwrap() {
            if t.seq_id == id {
                out.push((t.token, t.top_logprobs));
            }
        }
        engine.check_invariants().unwrap();
        if let Some(seq) = engine.take_finished(id) {
            return (out, seq.prompt_scores);
        }
    }
    panic!("sequence {id} never finished");
}

fn engine(max_batched_tokens: usize) -> LlmEngine {
    let config = SchedulerConfig {
        max_batched_tokens,
        enable_prefix_cache: false,
        ..SchedulerConfig::default()
    };
    common::tiny_engine(256, config, 1)
}

fn bits(top: &[(u32, f32)]) -> Vec<(u32, u32)> {
    top.iter().map(|&(t, l)| (t, l.to_bits())).collect()
}

#[test]
fn scored_prompt_rows_are_what_greedy_decoding_picks_there() {
    let prompt = tokens(1, 41);
    let mut e = engine(512);
    let id = e.add_sequence(
        prompt.clone(),
        greedy(None),
        stop(12),
        Priority::Ingest,
        None,
    );
    let (decoded, none) = run(&mut e, id);
    assert!(none.is_empty(), "nothing was asked to be scored");
    let ids: Vec<u32> = decoded.iter().map(|d| d.0).collect();

    // The decode's 11 first tokens as a draft after the prompt, scored from the prompt's last
    // row: in one chunk, in chunks of 16 (the draft split across steps), and beside another
    // sequence's prefill.
    for (max_batched, neighbour) in [(512, false), (16, false), (64, true)] {
        let mut e = engine(max_batched);
        if neighbour {
            e.add_sequence(
                tokens(7, 90),
                greedy(None),
                stop(4),
                Priority::Foreground,
                None,
            );
        }
        let mut drafted = prompt.clone();
        drafted.extend_from_slice(&ids[..11]);
        let from = Some(prompt.len() - 1);
        let id = e.add_sequence(drafted, greedy(from), stop(1), Priority::Ingest, None);
        let (next, scores) = run(&mut e, id);
        let picks: Vec<u32> = scores.iter().map(|s| s.token).collect();
        assert_eq!(
            picks,
            ids[..11],
            "chunk {max_batched}, neighbour {neighbour}"
        );
        for (s, d) in scores.iter().zip(&decoded) {
            assert_eq!(
                bits(&s.top_logprobs),
                bits(&d.1),
                "log-probabilities differ"
            );
        }
        // The one generated token is the decode's 12th.
        assert_eq!(next[0].0, ids[11]);
        assert_eq!(bits(&next[0].1), bits(&decoded[11].1));
    }
}

#[test]
fn a_draft_that_diverges_is_scored_with_the_models_own_picks() {
    let prompt = tokens(2, 30);
    let mut e = engine(512);
    let id = e.add_sequence(
        prompt.clone(),
        greedy(None),
        stop(6),
        Priority::Ingest,
        None,
    );
    let ids: Vec<u32> = run(&mut e, id).0.iter().map(|d| d.0).collect();
    // A draft that agrees for 3 tokens, then is wrong.
    let mut draft = ids[..3].to_vec();
    draft.push((ids[3] + 1) % 90 + 3);
    draft.push(ids[4]);
    let mut drafted = prompt.clone();
    drafted.extend_from_slice(&draft);
    let id = e.add_sequence(
        drafted,
        greedy(Some(prompt.len() - 1)),
        stop(1),
        Priority::Ingest,
        None,
    );
    let scores = run(&mut e, id).1;
    let picks: Vec<u32> = scores.iter().map(|s| s.token).collect();
    assert_eq!(picks.len(), draft.len());
    assert_eq!(
        picks[..4],
        ids[..4],
        "the picks up to the first wrong draft token"
    );
    assert_ne!(picks[3], draft[3]);
}
