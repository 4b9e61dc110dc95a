//! The engine thread behind its handle: many concurrent requests through one `EngineHandle`,
//! some dropped mid-generation (a client that disconnects). Every kept request gets exactly
//! its tokens and one `Finished`; each greedy output equals the request run alone; dropped
//! requests free their KV, so at the end no block is held and nothing is in flight.

use std::sync::atomic::Ordering;
use std::time::Duration;
use vigil_engine::engine_thread::{EngineHandle, GenerateRequest, RequestEvent};
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::{FinishReason, StopCriteria};

mod common;

fn spawn_engine(num_blocks: usize) -> EngineHandle {
    EngineHandle::spawn(move || {
        let config = SchedulerConfig {
            max_batched_tokens: 32,
            ..SchedulerConfig::default()
        };
        common::tiny_engine(num_blocks, config, 1)
    })
    .unwrap()
}

fn request(i: u32, max_tokens: usize) -> GenerateRequest {
    let prompt: Vec<u32> = (0..12 + i % 9).map(|k| 3 + (i * 7 + k * 13) % 90).collect();
    GenerateRequest {
        prompt,
        params: SamplingParams::default(),
        stop: StopCriteria {
            max_tokens,
            stop_token_ids: vec![],
            ignore_eos: true,
        },
        constraint: None,
        priority: Default::default(),
        pin: None,
    }
}

/// Collects a request's tokens; `drop_after` drops the stream after that many tokens.
async fn collect(handle: EngineHandle, i: u32, drop_after: Option<usize>) -> Option<Vec<u32>> {
    let mut stream = handle.submit(request(i, 20)).unwrap();
    let mut tokens = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            RequestEvent::Admitted { .. } => {}
            RequestEvent::Token { token, .. } => {
                tokens.push(token);
                if drop_after == Some(tokens.len()) {
                    return None;
                }
            }
            RequestEvent::Finished {
                reason,
                num_output_tokens,
                ..
            } => {
                assert_eq!(reason, FinishReason::Length);
                assert_eq!(num_output_tokens, tokens.len());
                return Some(tokens);
            }
            RequestEvent::Failed(e) => panic!("request {i} failed: {e}"),
        }
    }
    panic!("request {i}: stream ended without Finished");
}

#[test]
fn concurrent_requests_and_disconnects_leave_no_blocks_behind() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let handle = spawn_engine(48);
        let mut alone = Vec::new();
        for i in 0..24 {
            alone.push(collect(handle.clone(), i, None).await.unwrap());
        }
        let tasks: Vec<_> = (0..24u32)
            .map(|i| {
                let drop_after = (i % 3 == 1).then_some(1 + i as usize % 5);
                tokio::spawn(collect(handle.clone(), i, drop_after))
            })
            .collect();
        let mut finished = 0;
        for (i, t) in tasks.into_iter().enumerate() {
            if let Some(tokens) = t.await.unwrap() {
                assert_eq!(tokens, alone[i], "request {i} differs from running alone");
                finished += 1;
            }
        }
        assert_eq!(finished, 16);
        // Aborts are applied on the engine thread's next iteration.
        let stats = handle.stats.clone();
        for _ in 0..200 {
            if stats.in_flight.load(Ordering::Relaxed) == 0
                && stats.running.load(Ordering::Relaxed) == 0
                && stats.kv_blocks_free.load(Ordering::Relaxed)
                    == stats.kv_blocks_total.load(Ordering::Relaxed)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(stats.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(stats.running.load(Ordering::Relaxed), 0);
        assert_eq!(stats.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(
            stats.kv_blocks_free.load(Ordering::Relaxed),
            stats.kv_blocks_total.load(Ordering::Relaxed),
            "blocks still held after every request ended"
        );
        assert!(
            stats.preemptions.load(Ordering::Relaxed) > 0,
            "pool too big to exercise preemption"
        );
    });
}

/// A constraint that panics once its sequence has sampled `after` tokens: a stand-in for any
/// bug inside a step (the constraint runs on the engine thread, inside `step()`).
struct PanicsAfter {
    after: usize,
    seen: usize,
}

impl vigil_engine::constraint::TokenConstraint for PanicsAfter {
    fn mask(&mut self, logits: &mut [f32]) -> usize {
        if self.seen >= self.after {
            panic!("constraint bug after {} tokens", self.seen);
        }
        logits.len()
    }
    fn advance(&mut self, _token: u32) {
        self.seen += 1;
    }
    fn is_complete(&self) -> bool {
        false
    }
}

#[test]
fn a_panicking_step_fails_every_request_and_stops_the_engine() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let handle = spawn_engine(64);
        assert!(handle.is_alive());
        let mut bystander = handle.submit(request(1, 200)).unwrap();
        let mut faulty = request(2, 200);
        faulty.constraint = Some(Box::new(PanicsAfter { after: 3, seen: 0 }));
        let mut faulty = handle.submit(faulty).unwrap();
        let last = |ev: Option<RequestEvent>| ev.map(|e| format!("{e:?}"));
        let mut ends = Vec::new();
        for stream in [&mut faulty, &mut bystander] {
            let mut end = None;
            while let Some(ev) = stream.next().await {
                if matches!(ev, RequestEvent::Failed(_) | RequestEvent::Finished { .. }) {
                    end = last(Some(ev));
                    break;
                }
            }
            ends.push(end);
        }
        for end in &ends {
            let end = end.as_deref().unwrap_or("no end");
            assert!(
                end.starts_with("Failed(") && end.contains("constraint bug after 3 tokens"),
                "{end}"
            );
        }
        for _ in 0..200 {
            if !handle.is_alive() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !handle.is_alive(),
            "the engine thread kept running after a panic"
        );
        assert_eq!(handle.stats.in_flight.load(Ordering::Relaxed), 0);
        assert!(
            handle.submit(request(3, 4)).is_err(),
            "a stopped engine accepted a request"
        );
    });
}
