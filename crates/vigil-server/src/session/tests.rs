//! Session logic against the real engine on the tiny Llama checkpoint, without HTTP: push
//! ordering and loss accounting, windows that answer as a fresh session holding the retained
//! entries, flash answers equal to a cold greedy generate at the same version, the session's
//! share of a saturated engine, and every block freed on delete and on expiry.

use super::engine_work::SessionDeps;
use super::flash::Lookup;
use super::flash::{FlashSpec, Wrapped};
use super::state::{Entry, Overflow};
use super::testing::{plain_settings, spawn, spawn_as, tiny_deps, tiny_deps_with};
use super::Session;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vigil_engine::engine_thread::{GenerateRequest, RequestEvent};
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;

const OPENING: [u32; 3] = [1, 5, 9];

fn entries(deps: &SessionDeps, texts: &[&str]) -> Vec<Entry> {
    (texts.iter())
        .map(|t| Entry {
            text: t.to_string(),
            tokens: deps.tokenizer.encode(&format!("{t}\n"), false).unwrap(),
            queued: Instant::now(),
        })
        .collect()
}

fn texts(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{tag} {i} at {}", i * 7)).collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

async fn describe(s: &Session) -> Value {
    s.describe(false).await.unwrap()
}

/// Until every pushed entry is resident or dropped, nothing is pending, and the KV holds the
/// whole durable context (the opening too).
async fn settle(s: &Session) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = describe(s).await;
        let n = |k: &str| d[k].as_u64().unwrap();
        let landed = n("total_ingested") + n("total_dropped") == n("total_pushed");
        if n("pending") == 0 && landed && n("kv_tokens") == n("tokens") {
            return d;
        }
        assert!(Instant::now() < deadline, "the session never settled: {d}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn retained(data: &Value) -> Vec<String> {
    let e = data["entries"].as_array().unwrap();
    e.iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

fn question(deps: &SessionDeps, q: &str) -> FlashSpec {
    let tokens = deps.tokenizer.encode(q, false).unwrap();
    FlashSpec {
        query: q.to_string(),
        max_tokens: 8,
        tokens: tokens.len(),
        wrapped: Wrapped {
            data: tokens.clone(),
            chat: tokens,
        },
    }
}

/// The flash query's answer once it is current at the session's version.
async fn fresh_answer(s: &Session, q: &str) -> (Vec<u32>, String, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Lookup::Found {
            answer: Some(a),
            data_version,
            ..
        } = s.flash_lookup(None, q)
        {
            if a.data_version == data_version && data_version > 0 {
                return (a.ids, a.value, a.data_version);
            }
        }
        assert!(Instant::now() < deadline, "no fresh answer to {q:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A cold greedy generate of `prompt` (no session, no pin): its tokens.
async fn cold(deps: &SessionDeps, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    let request = GenerateRequest {
        prompt,
        params: super::engine_work::greedy(2),
        stop: StopCriteria {
            max_tokens,
            stop_token_ids: deps.tokenizer.eos_token_ids().to_vec(),
            ignore_eos: false,
        },
        constraint: None,
        priority: Default::default(),
        pin: None,
    };
    let mut stream = deps.engine.submit(request).ok().unwrap();
    let mut ids = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            RequestEvent::Token { token, .. } => ids.push(token),
            RequestEvent::Finished { .. } => return ids,
            RequestEvent::Failed(e) => panic!("cold generate failed: {e}"),
            RequestEvent::Admitted { .. } => {}
        }
    }
    panic!("the cold generate ended without finishing");
}

/// Until the engine holds no block, no pin and no request.
async fn assert_all_blocks_free(deps: &SessionDeps) {
    let st = deps.engine.stats.clone();
    let free = || {
        st.kv_blocks_free.load(Ordering::Relaxed) == st.kv_blocks_total.load(Ordering::Relaxed)
            && st.pins.load(Ordering::Relaxed) == 0
            && st.in_flight.load(Ordering::Relaxed) == 0
    };
    for _ in 0..400 {
        if free() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "blocks held after the session ended: {} of {} free, {} pins, {} in flight",
        st.kv_blocks_free.load(Ordering::Relaxed),
        st.kv_blocks_total.load(Ordering::Relaxed),
        st.pins.load(Ordering::Relaxed),
        st.in_flight.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_land_in_order_and_every_entry_is_resident_or_counted_dropped() {
    let deps = tiny_deps(128);
    let mut settings = plain_settings(OPENING.to_vec());
    settings.params.max_pending = 4;
    let s = spawn(deps.clone(), settings);
    // One push of 10 into a queue of 4: the 6 oldest are dropped at once, in the ack.
    let first = texts(10, "a");
    let ack = s.push(entries(&deps, &refs(&first))).await.unwrap();
    assert_eq!(
        (ack["pushed"].as_u64(), ack["dropped"].as_u64()),
        (Some(10), Some(6))
    );
    let d = settle(&s).await;
    assert_eq!(retained(&s.data().await.unwrap()), first[6..]);
    // Pushes one at a time keep their order across batches.
    let more = texts(5, "b");
    for t in &more {
        s.push(entries(&deps, &[t.as_str()])).await.unwrap();
    }
    let d2 = settle(&s).await;
    let mut want: Vec<String> = first[6..].to_vec();
    want.extend(more.iter().cloned());
    assert_eq!(retained(&s.data().await.unwrap()), want);
    assert_eq!(d["total_dropped"], 6);
    assert_eq!(
        (
            d2["total_pushed"].as_u64(),
            d2["total_ingested"].as_u64(),
            d2["total_dropped"].as_u64()
        ),
        (Some(15), Some(9), Some(6))
    );
    // The durable context is the opening then every retained entry's tokens.
    let ctx = s.context().await.unwrap();
    let mut mirror = OPENING.to_vec();
    for e in entries(&deps, &refs(&want)) {
        mirror.extend(e.tokens);
    }
    assert_eq!(ctx.mirror, mirror);
    assert_eq!(d2["kv_tokens"].as_u64(), Some(mirror.len() as u64), "{d2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_with_reject_refuses_the_push_and_drops_nothing() {
    let deps = tiny_deps(128);
    let mut settings = plain_settings(OPENING.to_vec());
    settings.params.max_pending = 3;
    settings.params.overflow = Overflow::Reject;
    let s = spawn(deps.clone(), settings);
    let e = s
        .push(entries(&deps, &refs(&texts(4, "r"))))
        .await
        .unwrap_err();
    assert_eq!(e.status.as_u16(), 429, "{}", e.message);
    let d = settle(&s).await;
    assert_eq!(
        (d["total_pushed"].as_u64(), d["total_dropped"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(
        deps.budget.used(),
        0,
        "a refused push holds no queue budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_windowed_session_answers_as_a_fresh_session_holding_its_retained_entries() {
    let deps = tiny_deps(256);
    let mut settings = plain_settings(OPENING.to_vec());
    settings.params.window = Some(40);
    settings.params.evict_to = Some(20);
    settings.params.max_pending = 64;
    let windowed = spawn_as(deps.clone(), settings, 1);
    let q = "what now?";
    windowed.add_flash(question(&deps, q)).await.unwrap();
    // Batches of one to three entries, so the window evicts and recomputes many times.
    for (i, t) in texts(24, "w").iter().enumerate() {
        windowed.push(entries(&deps, &[t.as_str()])).await.unwrap();
        if i % 3 == 0 {
            settle(&windowed).await;
        }
    }
    let d = settle(&windowed).await;
    assert!(
        d["evicted"].as_u64().unwrap() > 0 && d["window_recomputes"].as_u64().unwrap() > 1,
        "{d}"
    );
    let kept = retained(&windowed.data().await.unwrap());
    let fresh = spawn_as(deps.clone(), plain_settings(OPENING.to_vec()), 2);
    fresh.add_flash(question(&deps, q)).await.unwrap();
    fresh.push(entries(&deps, &refs(&kept))).await.unwrap();
    settle(&fresh).await;
    assert_eq!(
        windowed.context().await.unwrap().mirror,
        fresh.context().await.unwrap().mirror
    );
    let (a, text_a, _) = fresh_answer(&windowed, q).await;
    let (b, text_b, _) = fresh_answer(&fresh, q).await;
    assert_eq!((a, text_a), (b, text_b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_answer_equals_a_cold_greedy_generate_at_the_same_version() {
    let deps = tiny_deps(128);
    let s = spawn(deps.clone(), plain_settings(OPENING.to_vec()));
    let q = "how many?";
    s.add_flash(question(&deps, q)).await.unwrap();
    let spec = question(&deps, q);
    for round in 0..3 {
        let batch = texts(3, &format!("c{round}"));
        s.push(entries(&deps, &refs(&batch))).await.unwrap();
        settle(&s).await;
        let (ids, _, version) = fresh_answer(&s, q).await;
        let ctx = s.context().await.unwrap();
        assert_eq!(ctx.data_version, version);
        let mut prompt = ctx.mirror;
        prompt.extend_from_slice(&spec.wrapped.data);
        assert_eq!(
            ids,
            cold(&deps, prompt, spec.max_tokens).await,
            "at version {version}"
        );
    }
    let m = &deps.metrics;
    assert!(m.flash_evaluations.load(Ordering::Relaxed) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_keeps_its_share_while_client_prefills_saturate_the_engine() {
    let config = SchedulerConfig {
        max_batched_tokens: 32,
        ..SchedulerConfig::default()
    };
    let deps = tiny_deps_with(1536, config);
    let s = spawn(deps.clone(), plain_settings(OPENING.to_vec()));
    settle(&s).await; // The opening is resident.
                      // 40 client requests of 100 prompt tokens: 4,000 tokens of prefill at 32 a step. (Fewer
                      // made the comparison a matter of a few milliseconds on a fast CPU: flaky.)
    let started = Instant::now();
    let clients: Vec<_> = (0..40u32)
        .map(|i| {
            let engine = deps.engine.clone();
            tokio::spawn(async move {
                let prompt: Vec<u32> = (0..100).map(|k| 3 + (i * 11 + k * 7) % 90).collect();
                let stop = StopCriteria {
                    max_tokens: 4,
                    stop_token_ids: Vec::new(),
                    ignore_eos: true,
                };
                let request = GenerateRequest::new(prompt, Default::default(), stop);
                let mut stream = engine.submit(request).ok().unwrap();
                while let Some(ev) = stream.next().await {
                    if let RequestEvent::Token { .. } = ev {
                        return started.elapsed();
                    }
                }
                panic!("client {i} ended without a token");
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    s.push(entries(&deps, &["landed beside the clients"]))
        .await
        .unwrap();
    settle(&s).await;
    let resident = started.elapsed();
    let mut first_tokens = Vec::new();
    for c in clients {
        first_tokens.push(c.await.unwrap());
    }
    first_tokens.sort();
    // With a share of every step, the entry lands in a step or two, long before the clients'
    // prefill (about 50 steps) reaches its second half; without it, only once that ends.
    assert!(
        resident < first_tokens[20],
        "the entry became resident after {resident:?}, when half of the clients already had a token ({:?})",
        &first_tokens[..21]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_expiry_free_every_block() {
    let deps = tiny_deps(128);
    let s = spawn_as(deps.clone(), plain_settings(OPENING.to_vec()), 1);
    s.add_flash(question(&deps, "which?")).await.unwrap();
    s.push(entries(&deps, &refs(&texts(3, "d")))).await.unwrap();
    fresh_answer(&s, "which?").await;
    // A push still in flight when the delete comes is cancelled, not leaked.
    s.push(entries(&deps, &refs(&texts(3, "e")))).await.unwrap();
    s.delete().await.unwrap();
    assert!(s.is_deleted());
    assert!(
        s.describe(false).await.is_err(),
        "a deleted session answers 404"
    );
    assert_all_blocks_free(&deps).await;
    assert_eq!(deps.budget.used(), 0);

    let t = spawn_as(deps.clone(), plain_settings(OPENING.to_vec()), 2);
    t.push(entries(&deps, &refs(&texts(4, "x")))).await.unwrap();
    settle(&t).await;
    assert!(
        !t.expire_if_idle(Duration::from_secs(3600)).await,
        "not idle long enough"
    );
    assert!(t.expire_if_idle(Duration::ZERO).await);
    assert_all_blocks_free(&deps).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waits_for_the_batch_in_flight_and_settles_its_history() {
    let deps = tiny_deps(128);
    let s = spawn(deps.clone(), plain_settings(OPENING.to_vec()));
    settle(&s).await; // The opening is resident.
    s.push(entries(&deps, &refs(&texts(3, "t")))).await.unwrap();
    let ticket = s.begin_turn().await.unwrap();
    // The batch started by the push held the writer: the turn was granted once it landed.
    assert_eq!(describe(&s).await["total_ingested"], 3);
    let second = s.begin_turn().await.map(|_| ()).unwrap_err();
    assert_eq!(second.status.as_u16(), 409, "{}", second.message);
    assert!(
        s.delete().await.is_err(),
        "a session in a turn is not deleted"
    );
    let before = describe(&s).await["data_version"].as_u64().unwrap();
    ticket.keep(vec![1, 5, 9, 20, 21, 22]);
    let ctx = loop {
        let ctx = s.context().await.unwrap();
        if ctx.data_version > before {
            break ctx;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert_eq!(ctx.mirror, vec![1, 5, 9, 20, 21, 22]);
    assert_eq!(describe(&s).await["turns"], 1);
    // A turn whose ticket drops without a history changes nothing and frees the session.
    drop(s.begin_turn().await.unwrap());
    s.delete().await.unwrap();
    assert_all_blocks_free(&deps).await;
}

/// Tokens of `prompt` a stateless request finds in the prefix cache.
async fn cached_tokens(deps: &SessionDeps, prompt: Vec<u32>) -> usize {
    let stop = StopCriteria {
        max_tokens: 1,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    };
    let mut stream = (deps
        .engine
        .submit(GenerateRequest::new(prompt, Default::default(), stop)))
    .ok()
    .unwrap();
    while let Some(ev) = stream.next().await {
        if let RequestEvent::Finished {
            num_cached_tokens, ..
        } = ev
        {
            return num_cached_tokens;
        }
    }
    panic!("the request ended without finishing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shift_window_keeps_the_retained_kv_and_never_serves_it_from_the_prefix_cache() {
    let deps = tiny_deps(256);
    let mut settings = plain_settings(OPENING.to_vec());
    settings.params.window = Some(40);
    settings.params.evict_to = Some(20);
    settings.params.max_pending = 64;
    settings.params.window_mode = super::state::WindowMode::Shift;
    let s = spawn_as(deps.clone(), settings.clone(), 1);
    settings.params.window_mode = super::state::WindowMode::Exact;
    // On an engine of its own, so its exact KV never reaches the shift session's cache.
    let exact_deps = tiny_deps(256);
    let exact = spawn_as(exact_deps.clone(), settings, 2);
    let q = "what now?";
    s.add_flash(question(&deps, q)).await.unwrap();
    for (i, t) in texts(24, "w").iter().enumerate() {
        s.push(entries(&deps, &[t.as_str()])).await.unwrap();
        exact
            .push(entries(&exact_deps, &[t.as_str()]))
            .await
            .unwrap();
        if i % 3 == 0 {
            settle(&s).await;
            settle(&exact).await;
        }
    }
    let d = settle(&s).await;
    let e = settle(&exact).await;
    assert!(d["window_shifts"].as_u64().unwrap() > 1, "{d}");
    assert_eq!(d["window_recomputes"], 0, "{d}");
    assert_eq!(d["window_mode"], "shift");
    // The same entries are retained either way; only how their KV was made differs.
    assert_eq!(
        s.data().await.unwrap()["entries"],
        exact.data().await.unwrap()["entries"]
    );
    assert_eq!(e["evicted"], d["evicted"]);
    let mirror = s.context().await.unwrap().mirror;
    assert_eq!(mirror, exact.context().await.unwrap().mirror);
    fresh_answer(&s, q).await;
    // The shifted blocks are kept out of the prefix cache: a stateless request for the same
    // tokens finds only the first block there (the opening and the first token, which every
    // entry shares, computed exactly before anything was evicted).
    let mut prompt = mirror;
    prompt.push(7);
    let cached = cached_tokens(&deps, prompt.clone()).await;
    assert!(
        cached <= 4,
        "{cached} of {} tokens served from shifted KV",
        prompt.len()
    );
    s.delete().await.unwrap();
    assert_all_blocks_free(&deps).await;
}

/// The journal's model of a session, built from the records its actor logged, holds what the
/// actor holds: the retained entries in order, the pending ones, the counters and the flash
/// queries, through window evictions, overflow drops and flash changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_holds_what_the_actor_holds() {
    use super::journal::model::Op;
    let deps = tiny_deps(256);
    let mut settings = plain_settings(OPENING.to_vec());
    settings.params.window = Some(40);
    settings.params.evict_to = Some(20);
    settings.params.max_pending = 3;
    let id = "s1";
    let params = settings.params.clone();
    deps.journal.log(
        id,
        Op::Create {
            created_ms: 7,
            params,
        },
    );
    let s = spawn(deps.clone(), settings);
    settle(&s).await;
    let a = question(&deps, "what now?");
    s.add_flash(a).await.unwrap();
    s.add_flash(question(&deps, "and then?")).await.unwrap();
    for round in 0..6 {
        // Five at once into a queue of three: two dropped each time.
        let batch = texts(5, &format!("r{round}"));
        s.push(entries(&deps, &refs(&batch))).await.unwrap();
        if round == 3 {
            s.delete_flash(1).await.unwrap();
        }
        settle(&s).await;
    }
    let d = describe(&s).await;
    let data = s.data().await.unwrap();
    let (_, answer, version) = fresh_answer(&s, "and then?").await;
    let j = deps
        .journal
        .export(id)
        .await
        .expect("the journal holds the session");
    let logged = j.flash[0].answer.as_ref().expect("the answer is journaled");
    assert_eq!((&logged.value, logged.data_version), (&answer, version));
    let n = |k: &str| d[k].as_u64().unwrap();
    assert_eq!(j.entries, retained(&data));
    assert!(j.pending.is_empty() && j.in_flight.is_empty());
    assert_eq!(j.data_version, n("data_version"));
    assert_eq!(j.total_pushed, n("total_pushed"));
    assert_eq!(j.total_dropped, n("total_dropped"));
    assert!(j.total_dropped >= 12, "overflow dropped entries: {d}");
    assert_eq!(j.total_ingested, n("total_ingested"));
    assert_eq!(j.evicted, n("evicted"));
    assert!(j.evicted > 0, "the window evicted: {d}");
    assert_eq!(j.window_recomputes, n("window_recomputes"));
    let flash: Vec<u64> = j.flash.iter().map(|q| q.id).collect();
    assert_eq!(flash, [2]);
    assert_eq!(j.next_flash_id, 3);
    assert!(
        j.next_event_id > s.events.next_id(),
        "event ids are reserved ahead"
    );
    // Deleting forgets it.
    s.delete().await.unwrap();
    assert!(deps.journal.export(id).await.is_none());
}
