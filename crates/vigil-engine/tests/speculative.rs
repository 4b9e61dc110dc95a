//! Speculative decoding on a tiny real model: output with speculation is the output without it,
//! token for token and bit for bit in the log-probabilities, greedy or seeded sampling, alone
//! or batched; stop tokens and `max_tokens` cut a verification where decoding would stop;
//! a prediction drafts from its text; every step keeps the block invariant. (The scheduler
//! churn test runs the same rollback under preemption; the API tests run it on SmolLM2.)

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use vigil_engine::engine::LlmEngine;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{SeqId, StopCriteria};
use vigil_engine::speculative::{SpecMethod, SpecRequest};

use common::{tiny_engine, Lcg};

/// A generated token with its log-probability bits.
type Token = (u32, u32);

fn engine(method: SpecMethod) -> LlmEngine {
    let config = SchedulerConfig {
        max_batched_tokens: 64,
        ..SchedulerConfig::default()
    };
    let mut e = tiny_engine(512, config, 2);
    e.spec.method = method;
    e
}

fn stop(max_tokens: usize, stop_token_ids: Vec<u32>) -> StopCriteria {
    StopCriteria {
        max_tokens,
        ignore_eos: stop_token_ids.is_empty(),
        stop_token_ids,
    }
}

/// Prompts that invite drafts: a repeated span, a counting pattern, and random tokens.
fn prompts() -> Vec<Vec<u32>> {
    let mut rng = Lcg(5);
    let span: Vec<u32> = (0..9).map(|_| 3 + rng.next(300) as u32).collect();
    let mut repeated = span.clone();
    repeated.extend([7, 8]);
    repeated.extend(&span);
    repeated.extend(&span[..3]);
    let counting: Vec<u32> = (0..30).map(|i| 10 + (i % 6)).collect();
    let random: Vec<u32> = (0..20).map(|_| 3 + rng.next(380) as u32).collect();
    vec![repeated, counting, random]
}

/// Run every request to completion in one engine, all submitted at once (so they batch);
/// their tokens in request order.
fn run(
    e: &mut LlmEngine,
    requests: &[(Vec<u32>, SamplingParams, StopCriteria)],
) -> Vec<Vec<Token>> {
    let ids: Vec<SeqId> = (requests.iter())
        .map(|(p, s, st)| e.add_request(p.clone(), s.clone(), st.clone()))
        .collect();
    let mut out: HashMap<SeqId, Vec<Token>> = HashMap::new();
    while e.has_work() {
        for t in e.step().unwrap() {
            (out.entry(t.seq_id).or_default()).push((t.token, t.logprob.to_bits()));
            if t.finished.is_some() {
                let seq = e.take_finished(t.seq_id).unwrap();
                assert_eq!(seq.output_ids().len(), out[&t.seq_id].len());
            }
        }
        e.check_invariants().unwrap();
    }
    assert!(e.seqs.is_empty());
    assert_eq!(e.pool.borrow().num_used_blocks(), 0, "blocks leaked");
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

fn greedy() -> SamplingParams {
    SamplingParams {
        logprobs: Some(2),
        ..SamplingParams::default()
    }
}

#[test]
fn greedy_output_is_identical_with_either_proposer_alone_and_batched() {
    let requests: Vec<_> = (prompts().into_iter())
        .map(|p| (p, greedy(), stop(60, vec![])))
        .collect();
    let plain = run(&mut engine(SpecMethod::Off), &requests);
    for method in [SpecMethod::Ngram, SpecMethod::Suffix] {
        let mut e = engine(method);
        assert_eq!(run(&mut e, &requests), plain, "{method:?} batched");
        for (i, r) in requests.iter().enumerate() {
            let alone = run(&mut e, std::slice::from_ref(r));
            assert_eq!(alone[0], plain[i], "{method:?} alone, prompt {i}");
        }
        let s = e.spec_stats;
        eprintln!("{method:?}: {s:?}");
        assert!(s.accepted_tokens > 0, "{method:?}: nothing accepted");
        assert!(
            s.accepted_tokens > s.drafts,
            "{method:?}: never more than one token a verification"
        );
    }
}

/// `n` seeded sampling requests (temperature, top-p, top-k, repetition and frequency
/// penalties) over the three prompts.
fn seeded_requests(n: u64, max_tokens: usize) -> Vec<(Vec<u32>, SamplingParams, StopCriteria)> {
    let sampled = |seed: u64| SamplingParams {
        temperature: 0.5,
        top_p: 0.95,
        top_k: 40,
        repetition_penalty: 1.05,
        frequency_penalty: 0.1,
        seed: Some(seed),
        logprobs: Some(1),
        ..SamplingParams::default()
    };
    (0..n)
        .map(|seed| {
            let p = prompts()[seed as usize % 3].clone();
            (p, sampled(seed), stop(max_tokens, vec![]))
        })
        .collect()
}

#[test]
fn seeded_sampling_is_identical_with_speculation() {
    // Rows are sampled in order with the same RNG draws a plain decode makes, so a seed gives
    // the same text: the distribution is exactly the plain one's.
    let requests = seeded_requests(24, 40);
    let plain = run(&mut engine(SpecMethod::Off), &requests);
    let mut e = engine(SpecMethod::Suffix);
    assert_eq!(run(&mut e, &requests), plain);
    assert!(e.spec_stats.accepted_tokens > 0, "{:?}", e.spec_stats);
}

/// The distribution test the rejection rule promises, without leaning on equal seeds: two
/// disjoint sets of seeds, one with speculation and one without, give the same histogram of
/// tokens at later positions (a two-sample chi-squared test well inside its 0.1% bound).
#[test]
fn sampled_outputs_keep_their_distribution() {
    let prompt = prompts()[1].clone();
    let params = |seed: u64| SamplingParams {
        temperature: 1.0,
        top_k: 6,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let n = 300u64;
    let plain_reqs: Vec<_> = (0..n)
        .map(|s| (prompt.clone(), params(s), stop(8, vec![])))
        .collect();
    let spec_reqs: Vec<_> = (0..n)
        .map(|s| (prompt.clone(), params(10_000 + s), stop(8, vec![])))
        .collect();
    let plain = run(&mut engine(SpecMethod::Off), &plain_reqs);
    let mut e = engine(SpecMethod::Suffix);
    let spec = run(&mut e, &spec_reqs);
    assert!(e.spec_stats.accepted_tokens > 0, "{:?}", e.spec_stats);
    for pos in [2usize, 5, 7] {
        let mut counts: HashMap<u32, (f64, f64)> = HashMap::new();
        for o in &plain {
            counts.entry(o[pos].0).or_default().0 += 1.0;
        }
        for o in &spec {
            counts.entry(o[pos].0).or_default().1 += 1.0;
        }
        // Pool rare tokens so every cell expects at least 5.
        let (mut cells, mut rare) = (Vec::new(), (0.0, 0.0));
        for &(a, b) in counts.values() {
            if a + b < 10.0 {
                rare = (rare.0 + a, rare.1 + b);
            } else {
                cells.push((a, b));
            }
        }
        if rare.0 + rare.1 > 0.0 {
            cells.push(rare);
        }
        let chi2: f64 = (cells.iter())
            .map(|&(a, b)| (a - b) * (a - b) / (a + b))
            .sum();
        let df = cells.len().saturating_sub(1).max(1) as f64;
        // The 0.1% critical value, by the Wilson–Hilferty approximation.
        let z = 3.09;
        let bound = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        assert!(
            chi2 < bound,
            "position {pos}: chi2 {chi2:.1} over {df} df (bound {bound:.1})"
        );
    }
}

/// One request's greedy tokens without speculation.
fn plain(prompt: &[u32], max_tokens: usize) -> Vec<Token> {
    let request = (prompt.to_vec(), greedy(), stop(max_tokens, vec![]));
    run(&mut engine(SpecMethod::Off), &[request]).remove(0)
}

fn predicting(prediction: Vec<u32>) -> SamplingParams {
    SamplingParams {
        speculative: SpecRequest {
            method: Some(SpecMethod::Suffix),
            prediction: Some(Arc::from(prediction)),
        },
        ..greedy()
    }
}

#[test]
fn stop_tokens_and_max_tokens_end_a_verification_where_decoding_ends() {
    // The output runs 141 ×16, 232 ×14, 322 ×18; predicted exactly, the first 232 arrives
    // inside an accepted draft, and as a stop token it ends the sequence there.
    let prompt = prompts()[1].clone();
    let plain = plain(&prompt, 48);
    let tokens: Vec<u32> = plain.iter().map(|t| t.0).collect();
    let stop_at = tokens[20];
    let first = tokens.iter().position(|&t| t == stop_at).unwrap();
    assert!(first > 8, "the stop token comes after drafts");
    let mut e = engine(SpecMethod::Off);
    let params = predicting(tokens.clone());
    let cut = run(&mut e, &[(prompt.clone(), params, stop(48, vec![stop_at]))]);
    assert_eq!(cut[0], plain[..=first]);
    assert!(
        e.spec_stats.accepted_tokens > first as u64 / 2,
        "{:?}",
        e.spec_stats
    );
    let mut e = engine(SpecMethod::Suffix);
    for max in [1, 2, 5, 11, 17] {
        let out = run(&mut e, &[(prompt.clone(), greedy(), stop(max, vec![]))]);
        assert_eq!(out[0], plain[..max], "max_tokens {max}");
    }
}

/// A prediction of the output (OpenAI's predicted outputs) is searched beside the context: on
/// a prompt whose output changes token at two places the context cannot foresee, a correct
/// prediction has every draft accepted; a wrong one changes nothing in the output.
#[test]
fn a_prediction_drafts_the_expected_output() {
    let prompt = prompts()[1].clone();
    let plain = vec![plain(&prompt, 48)];
    let expected: Vec<u32> = plain[0].iter().map(|t| t.0).collect();
    let with = predicting;
    // Without a prediction the context's loops mispredict where the output changes.
    let mut e = engine(SpecMethod::Suffix);
    assert_eq!(
        run(&mut e, &[(prompt.clone(), greedy(), stop(48, vec![]))]),
        plain
    );
    let guessed = e.spec_stats;
    assert!(
        guessed.accepted_tokens < guessed.proposed_tokens,
        "{guessed:?}"
    );
    // The server-wide method is off: the request asks for it.
    let mut e = engine(SpecMethod::Off);
    let out = run(
        &mut e,
        &[(prompt.clone(), with(expected.clone()), stop(48, vec![]))],
    );
    assert_eq!(out, plain);
    let s = e.spec_stats;
    assert_eq!(s.accepted_tokens, s.proposed_tokens, "{s:?}");
    assert!(s.accepted_tokens >= 36 && s.drafts <= 10, "{s:?}");
    let mut wrong = expected;
    for t in &mut wrong[20..30] {
        *t = 3 + (*t + 1) % 380;
    }
    let mut e = engine(SpecMethod::Off);
    assert_eq!(
        run(&mut e, &[(prompt, with(wrong), stop(48, vec![]))]),
        plain
    );
}

fn engine_with_draft(dir: &str) -> LlmEngine {
    let mut e = engine(SpecMethod::Draft);
    common::attach_draft(&mut e, dir, 512);
    e
}

/// A draft model proposes; the target's output does not change, whether the draft agrees
/// almost always (the same weights rounded to BF16) or seldom (an unrelated model of the same
/// vocabulary), greedy or seeded; the draft model's own blocks all come back.
#[test]
fn a_draft_model_changes_no_output() {
    let greedy_requests: Vec<_> = (prompts().into_iter())
        .map(|p| (p, greedy(), stop(60, vec![])))
        .collect();
    let sampled_requests = seeded_requests(12, 40);
    let plain_greedy = run(&mut engine(SpecMethod::Off), &greedy_requests);
    let plain_sampled = run(&mut engine(SpecMethod::Off), &sampled_requests);
    for (dir, agrees) in [("llama_bf16", true), ("qwen3", false)] {
        let mut e = engine_with_draft(dir);
        assert_eq!(run(&mut e, &greedy_requests), plain_greedy, "{dir} greedy");
        let greedy_stats = e.spec_stats;
        assert_eq!(
            run(&mut e, &sampled_requests),
            plain_sampled,
            "{dir} sampled"
        );
        for (i, r) in greedy_requests.iter().enumerate() {
            assert_eq!(
                run(&mut e, std::slice::from_ref(r))[0],
                plain_greedy[i],
                "{dir} alone {i}"
            );
        }
        let s = greedy_stats;
        eprintln!("{dir}: greedy {s:?}, in all {:?}", e.spec_stats);
        assert!(
            s.proposed_tokens > 0,
            "{dir}: the draft model never proposed"
        );
        if agrees {
            assert!(
                s.accepted_tokens * 10 >= s.proposed_tokens * 9,
                "{dir}: a near-copy of the target should be accepted: {s:?}"
            );
        } else {
            assert!(s.accepted_tokens < s.proposed_tokens, "{dir}: {s:?}");
        }
        e.step().unwrap();
        let draft = e.draft.as_ref().unwrap();
        assert_eq!(draft.num_used_blocks(), 0, "{dir}: draft blocks leaked");
    }
}
