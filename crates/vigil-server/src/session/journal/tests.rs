//! The state directory against its promises: a log cut anywhere restores to its last whole
//! record, a corrupted snapshot falls back to the one before it and the log, closing segments
//! keeps every session, one server per directory, and another model's state is refused.

use super::frame;
use super::model::{AnswerRecord, DurableSession, Model, Op, Record, SessionParams};
use super::store::{self, Fingerprint, StoreError};
use crate::session::state::{Overflow, WindowMode};
use std::path::PathBuf;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "vigil-journal-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fp() -> Fingerprint {
    Fingerprint {
        model: "tiny".into(),
        vocab_size: 100,
    }
}

fn params() -> SessionParams {
    SessionParams {
        window: Some(8),
        evict_to: Some(4),
        window_mode: WindowMode::Exact,
        pre_decode: false,
        prompt: Some("watch".into()),
        overflow: Overflow::DropOldest,
        max_pending: 3,
        max_pending_bytes: 1 << 20,
    }
}

/// A history touching every operation, on two sessions (one deleted on the way).
fn history() -> Vec<Record> {
    let r = |s: &str, op| Record {
        session: s.into(),
        op,
    };
    let push = |k: usize| Op::Push {
        entries: (0..k).map(|i| format!("entry {i} of {k}")).collect(),
        dropped: (k as u64).saturating_sub(3),
    };
    vec![
        r(
            "a",
            Op::Create {
                created_ms: 1,
                params: params(),
            },
        ),
        r(
            "b",
            Op::Create {
                created_ms: 2,
                params: params(),
            },
        ),
        r("a", push(2)),
        r("a", Op::Taken { n: 2 }),
        r("a", push(5)),
        r(
            "a",
            Op::AddFlash {
                id: 1,
                query: "how many?".into(),
                max_tokens: 8,
            },
        ),
        r(
            "a",
            Op::Landed {
                evicted: 0,
                evicted_tokens: 0,
                shifted: false,
                base: None,
            },
        ),
        r("b", push(1)),
        r("a", Op::Taken { n: 3 }),
        r(
            "a",
            Op::Landed {
                evicted: 3,
                evicted_tokens: 12,
                shifted: false,
                base: None,
            },
        ),
        r("a", Op::Events { reserved: 1025 }),
        r("b", Op::Delete),
        r(
            "a",
            Op::Settle {
                base: vec![1, 2, 3],
                turn: true,
            },
        ),
        r("a", push(1)),
        r("a", Op::Taken { n: 1 }),
        r("a", Op::Lost),
        r(
            "a",
            Op::AddFlash {
                id: 2,
                query: "and now?".into(),
                max_tokens: 4,
            },
        ),
        r("a", Op::DeleteFlash { id: 1 }),
        r(
            "a",
            Op::FlashAnswer {
                id: 2,
                answer: AnswerRecord {
                    value: "now".into(),
                    ids: vec![7, 8],
                    stopped: true,
                    data_version: 7,
                    confidence: 0.5,
                    evaluated_at: 11,
                },
            },
        ),
        r(
            "a",
            Op::FlashAnswer {
                id: 1,
                answer: AnswerRecord {
                    value: "deleted query".into(),
                    ids: vec![],
                    stopped: false,
                    data_version: 7,
                    confidence: 0.0,
                    evaluated_at: 11,
                },
            },
        ),
        r(
            "a",
            Op::Warmed {
                base: vec![1, 2, 3, 4],
                data_version: 9,
            },
        ),
        r("a", push(2)),
        r("a", Op::Taken { n: 1 }),
        r(
            "a",
            Op::Landed {
                evicted: 0,
                evicted_tokens: 0,
                shifted: false,
                base: Some(vec![1, 2, 3, 4, 5]),
            },
        ),
        r(
            "c",
            Op::Import {
                state: Box::new(DurableSession::new("exported-as".into(), 3, params())),
            },
        ),
        r(
            "c",
            Op::Push {
                entries: vec!["x".into()],
                dropped: 0,
            },
        ),
    ]
}

/// The model after each prefix of `records`.
fn prefixes(records: &[Record]) -> Vec<Model> {
    let mut m = Model::default();
    let mut v = vec![m.clone()];
    for r in records {
        m.apply(r.clone());
        v.push(m.clone());
    }
    v
}

/// Log `records` into a fresh directory, one sync each; the segment's path and where each
/// record ends in it.
fn logged(dir: &std::path::Path, records: &[Record]) -> (PathBuf, Vec<u64>) {
    let opened = store::open(dir, &fp(), u64::MAX).unwrap();
    assert!(opened.model.sessions.is_empty());
    let mut s = opened.store;
    let segment = newest(dir, "wal-");
    let mut ends = vec![std::fs::metadata(&segment).unwrap().len()];
    for r in records {
        let mut buf = Vec::new();
        frame::frame(&serde_json::to_vec(r).unwrap(), &mut buf);
        s.append(&buf).unwrap();
        s.sync().unwrap();
        ends.push(std::fs::metadata(&segment).unwrap().len());
    }
    (segment, ends)
}

fn newest(dir: &std::path::Path, prefix: &str) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .collect();
    v.sort();
    v.pop().unwrap()
}

#[test]
fn the_fold_moves_entries_as_the_actor_does() {
    let m = prefixes(&history()).pop().unwrap();
    assert_eq!(m.sessions.len(), 2, "b was deleted");
    let c = &m.sessions["c"];
    assert_eq!(
        (c.id.as_str(), c.created_ms, c.total_pushed),
        ("c", 3, 1),
        "imported under its record's id"
    );
    let a: &DurableSession = &m.sessions["a"];
    // 2 + 5 pushed (2 dropped by overflow) + 1 + 2; batches of 2 and 3 landed, then one lost.
    assert_eq!(a.total_pushed, 10);
    assert_eq!(a.total_dropped, 2 + 1);
    assert_eq!(a.total_ingested, 2 + 3 + 1);
    assert_eq!(a.pending, ["entry 1 of 2"]);
    assert_eq!(
        a.entries,
        ["entry 0 of 2"],
        "the settle cleared the entries before"
    );
    assert_eq!(a.base.as_deref(), Some(&[1, 2, 3, 4, 5][..]));
    assert!(!a.chat_layout);
    assert_eq!(a.data_version, 10, "9 from the warm, then one batch");
    assert_eq!(
        (a.evicted, a.evicted_tokens, a.window_recomputes),
        (3, 12, 1)
    );
    assert_eq!(a.turns, 1);
    assert_eq!(a.flash.len(), 1);
    assert_eq!((a.flash[0].id, a.next_flash_id), (2, 3));
    let answer = a.flash[0].answer.as_ref().expect("the answer is kept");
    assert_eq!((answer.value.as_str(), answer.data_version), ("now", 7));
    assert_eq!(a.next_event_id, 1025);
}

#[test]
fn a_log_cut_at_any_offset_restores_every_record_before_the_cut() {
    let records = history();
    let expect = prefixes(&records);
    let dir = temp_dir("torn");
    let (segment, ends) = logged(&dir, &records);
    let whole = std::fs::read(&segment).unwrap();
    let name = segment.file_name().unwrap().to_owned();
    // Every record boundary, a point inside every record, and a spread of offsets.
    let mut cuts: Vec<u64> = ends.clone();
    cuts.extend(ends.windows(2).map(|w| (w[0] + w[1]) / 2));
    cuts.extend((0..whole.len() as u64).step_by(37));
    for cut in cuts {
        let case = temp_dir("torn-case");
        std::fs::write(case.join(&name), &whole[..cut as usize]).unwrap();
        let opened = store::open(&case, &fp(), u64::MAX).unwrap();
        let kept = ends.iter().filter(|&&e| e <= cut).count().max(1) - 1;
        assert_eq!(
            opened.model, expect[kept],
            "cut at {cut}: {kept} whole records"
        );
        let torn = !ends.contains(&cut) && cut > 0;
        assert_eq!(
            opened.notes.iter().any(|n| n.contains("torn tail")),
            torn,
            "cut at {cut}: {:?}",
            opened.notes
        );
        // Restoring wrote a snapshot: the next start reads the same, with nothing to report.
        drop(opened);
        let again = store::open(&case, &fp(), u64::MAX).unwrap();
        assert_eq!(again.model, expect[kept]);
        assert!(again.notes.is_empty(), "{:?}", again.notes);
        std::fs::remove_dir_all(&case).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn closing_segments_keeps_every_session_and_a_corrupted_snapshot_falls_back_to_the_log() {
    let records = history();
    let expect = prefixes(&records).pop().unwrap();
    let dir = temp_dir("rotate");
    {
        // A tiny segment limit: a snapshot after nearly every record.
        let opened = store::open(&dir, &fp(), 64).unwrap();
        let mut s = opened.store;
        let mut m = opened.model;
        for r in &records {
            let mut buf = Vec::new();
            frame::frame(&serde_json::to_vec(r).unwrap(), &mut buf);
            s.append(&buf).unwrap();
            s.sync().unwrap();
            m.apply(r.clone());
            if s.should_rotate() {
                s.rotate(&m).unwrap();
            }
        }
    }
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert!(
        files <= 5,
        "old segments and snapshots are deleted ({files} files)"
    );
    assert_eq!(store::open(&dir, &fp(), 64).unwrap().model, expect);
    // Corrupt the newest snapshot: the previous one and the log after it give the same.
    let snap = newest(&dir, "snapshot-");
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0xff;
    std::fs::write(&snap, bytes).unwrap();
    let opened = store::open(&dir, &fp(), 64).unwrap();
    assert_eq!(opened.model, expect);
    assert!(
        opened.notes.iter().any(|n| n.contains("unreadable")),
        "{:?}",
        opened.notes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_server_per_directory_and_only_for_its_model() {
    let dir = temp_dir("lock");
    let held = store::open(&dir, &fp(), u64::MAX).unwrap();
    assert!(matches!(
        store::open(&dir, &fp(), u64::MAX),
        Err(StoreError::Locked { .. })
    ));
    drop(held);
    let other = Fingerprint {
        model: "another".into(),
        vocab_size: 100,
    };
    let err = store::open(&dir, &other, u64::MAX).err().unwrap();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("`tiny`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
