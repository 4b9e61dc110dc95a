//! The state directory (`--state-dir`): log segments, snapshots, and a lock so two servers
//! never write one directory.
//!
//! Files: `LOCK`; `wal-N.log`, the records logged after snapshot `N`; `snapshot-N.snap`, every
//! session as of the start of segment `N` (written to a temporary name, synced, renamed). A
//! segment past `segment_limit` bytes is closed by writing the next snapshot and opening the
//! next segment. The previous snapshot and the segments after it are kept, so a corrupted
//! snapshot falls back to the one before it and the log; older files are deleted.
//!
//! Opening the directory restores: the newest snapshot that reads whole, then every segment
//! from it on, in order. A torn tail (a power cut mid-write) in the last segment restores up
//! to its last whole record and says so. Then a fresh snapshot and segment are written, so
//! restart time stays bounded by one snapshot and one segment.

use super::frame::{self, FrameError, SEGMENT_MAGIC, SNAPSHOT_MAGIC};
use super::model::{DurableSession, Model, Record};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Which model wrote the state: sessions are token streams of one tokenizer and answers of
/// one model, so another model must not restore them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub model: String,
    pub vocab_size: usize,
}

/// The first record of every segment and snapshot.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    fingerprint: Fingerprint,
    /// In a snapshot: how many session records follow (a shorter one is incomplete).
    #[serde(default)]
    sessions: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error("state directory {dir} is in use by another vigil server (its LOCK is held); give this one another --state-dir, or --no-persist")]
    Locked { dir: String },
    #[error("state directory {dir} holds sessions of model `{found}` (vocabulary {found_vocab}); this server loads `{expected}` (vocabulary {expected_vocab}). Start it with that model, or give it another --state-dir (or --no-persist)")]
    Mismatch {
        dir: String,
        found: String,
        found_vocab: usize,
        expected: String,
        expected_vocab: usize,
    },
    #[error("state directory {dir}, {file}: {source}")]
    Format {
        dir: String,
        file: String,
        source: FrameError,
    },
}

pub struct Store {
    dir: PathBuf,
    fingerprint: Fingerprint,
    /// Held for the store's life: the OS lock on `LOCK`.
    _lock: File,
    segment: File,
    segment_no: u64,
    segment_len: u64,
    segment_limit: u64,
}

/// A restored directory: the store to append to, what it held, and what restoring found.
pub struct Opened {
    pub store: Store,
    pub model: Model,
    /// Torn tails, corrupted snapshots, lost segments: each said once in the log.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Snapshot,
    Segment,
}

fn name(kind: Kind, n: u64) -> String {
    match kind {
        Kind::Snapshot => format!("snapshot-{n:016}.snap"),
        Kind::Segment => format!("wal-{n:016}.log"),
    }
}

fn parse(name: &str) -> Option<(Kind, u64)> {
    let (kind, rest) = if let Some(r) = name.strip_prefix("snapshot-") {
        (Kind::Snapshot, r.strip_suffix(".snap")?)
    } else {
        (
            Kind::Segment,
            name.strip_prefix("wal-")?.strip_suffix(".log")?,
        )
    };
    (rest.len() == 16).then(|| rest.parse().ok().map(|n| (kind, n)))?
}

impl Store {
    fn io(&self, source: std::io::Error) -> StoreError {
        io_err(&self.dir, source)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Append whole framed records to the open segment.
    pub fn append(&mut self, framed: &[u8]) -> std::io::Result<()> {
        self.segment.write_all(framed)?;
        self.segment_len += framed.len() as u64;
        Ok(())
    }

    /// Make what was appended durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.segment.sync_data()
    }

    pub fn should_rotate(&self) -> bool {
        self.segment_len > self.segment_limit
    }

    /// Close the segment: snapshot `model` (what every record so far built), open the next
    /// segment, delete what the previous snapshot made redundant.
    pub fn rotate(&mut self, model: &Model) -> Result<(), StoreError> {
        let next = self.segment_no + 1;
        write_snapshot(&self.dir, &self.fingerprint, next, model).map_err(|e| self.io(e))?;
        let (segment, len) =
            new_segment(&self.dir, &self.fingerprint, next).map_err(|e| self.io(e))?;
        let previous = self.segment_no;
        self.segment = segment;
        self.segment_no = next;
        self.segment_len = len;
        // The snapshot just closed and its segment stay, for a fallback.
        remove_before(&self.dir, previous).map_err(|e| self.io(e))
    }
}

fn io_err(dir: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        dir: dir.display().to_string(),
        source,
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn write_snapshot(dir: &Path, fp: &Fingerprint, n: u64, model: &Model) -> std::io::Result<()> {
    let mut buf = frame::header(SNAPSHOT_MAGIC).to_vec();
    let meta = Meta {
        fingerprint: fp.clone(),
        sessions: Some(model.sessions.len()),
    };
    frame::frame(&serde_json::to_vec(&meta)?, &mut buf);
    for s in model.sessions.values() {
        frame::frame(&serde_json::to_vec(s)?, &mut buf);
    }
    let path = dir.join(name(Kind::Snapshot, n));
    let tmp = path.with_extension("snap.tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&buf)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    sync_dir(dir)
}

fn new_segment(dir: &Path, fp: &Fingerprint, n: u64) -> std::io::Result<(File, u64)> {
    let mut buf = frame::header(SEGMENT_MAGIC).to_vec();
    let meta = Meta {
        fingerprint: fp.clone(),
        sessions: None,
    };
    frame::frame(&serde_json::to_vec(&meta)?, &mut buf);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join(name(Kind::Segment, n)))?;
    f.write_all(&buf)?;
    f.sync_all()?;
    sync_dir(dir)?;
    Ok((f, buf.len() as u64))
}

/// Delete every snapshot and segment numbered below `n`.
fn remove_before(dir: &Path, n: u64) -> std::io::Result<()> {
    for (kind, k) in list(dir)? {
        if k < n {
            fs::remove_file(dir.join(name(kind, k)))?;
        }
    }
    Ok(())
}

fn list(dir: &Path) -> std::io::Result<Vec<(Kind, u64)>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        if let Some(p) = e?.file_name().to_str().and_then(parse) {
            v.push(p);
        }
    }
    v.sort_by_key(|&(kind, n)| (n, kind));
    Ok(v)
}

/// Open (or create) the state directory and restore what it holds.
pub fn open(dir: &Path, fp: &Fingerprint, segment_limit: u64) -> Result<Opened, StoreError> {
    let err = |e| io_err(dir, e);
    fs::create_dir_all(dir).map_err(err)?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))
        .map_err(err)?;
    if lock.try_lock().is_err() {
        return Err(StoreError::Locked {
            dir: dir.display().to_string(),
        });
    }
    let files = list(dir).map_err(err)?;
    let mut notes = Vec::new();
    let check = |found: &Fingerprint| -> Result<(), StoreError> {
        if found == fp {
            return Ok(());
        }
        Err(StoreError::Mismatch {
            dir: dir.display().to_string(),
            found: found.model.clone(),
            found_vocab: found.vocab_size,
            expected: fp.model.clone(),
            expected_vocab: fp.vocab_size,
        })
    };
    // The newest snapshot that reads whole.
    let mut model = Model::default();
    let mut start = None;
    for &(_, n) in files.iter().rev().filter(|(k, _)| *k == Kind::Snapshot) {
        let file = name(Kind::Snapshot, n);
        let bytes = fs::read(dir.join(&file)).map_err(err)?;
        match read_snapshot(&bytes) {
            Ok((found, sessions)) => {
                check(&found)?;
                model.sessions = sessions.into_iter().map(|s| (s.id.clone(), s)).collect();
                start = Some(n);
                break;
            }
            Err(why) => notes.push(format!(
                "{file} is unreadable ({why}); falling back to an older snapshot and the log"
            )),
        }
    }
    let start = start.unwrap_or(0);
    let segments: Vec<u64> = (files.iter())
        .filter(|&&(k, n)| k == Kind::Segment && n >= start)
        .map(|&(_, n)| n)
        .collect();
    if segments.first().is_some_and(|&first| first > start) {
        notes.push(format!(
            "the log from segment {start} to {} is missing: sessions are restored without those records",
            segments[0]
        ));
    }
    let mut previous = None;
    for (i, &n) in segments.iter().enumerate() {
        if previous.is_some_and(|p: u64| n != p + 1) {
            notes.push(format!(
                "log segment {} is missing: restoring stops before it",
                previous.unwrap_or(0) + 1
            ));
            break;
        }
        previous = Some(n);
        let file = name(Kind::Segment, n);
        let bytes = fs::read(dir.join(&file)).map_err(err)?;
        let scan = frame::scan(&bytes, SEGMENT_MAGIC).map_err(|source| StoreError::Format {
            dir: dir.display().to_string(),
            file: file.clone(),
            source,
        })?;
        let mut records = scan.records.iter();
        if let Some(meta) = records.next() {
            match serde_json::from_slice::<Meta>(meta) {
                Ok(m) => check(&m.fingerprint)?,
                Err(e) => {
                    notes.push(format!(
                        "{file}: unreadable header record ({e}); restoring stops here"
                    ));
                    break;
                }
            }
        }
        let mut applied = 0usize;
        let mut stopped = false;
        for r in records {
            match serde_json::from_slice::<Record>(r) {
                Ok(rec) => {
                    model.apply(rec);
                    applied += 1;
                }
                Err(e) => {
                    notes.push(format!("{file}: record {applied} is not a record this Vigil reads ({e}); restoring stops there"));
                    stopped = true;
                    break;
                }
            }
        }
        if let Some(why) = scan.torn {
            let last = i + 1 == segments.len();
            notes.push(format!(
                "{file}: torn tail ({why}); restored up to its last whole record ({applied} records, {} of {} bytes){}",
                scan.valid_len,
                bytes.len(),
                if last { "" } else { "; the segments after it are not replayed" }
            ));
            if !last {
                break;
            }
        }
        if stopped {
            break;
        }
    }
    // A fresh snapshot of what was restored, and a new segment after it.
    let next = files.last().map_or(0, |&(_, n)| n + 1);
    write_snapshot(dir, fp, next, &model).map_err(err)?;
    let (segment, segment_len) = new_segment(dir, fp, next).map_err(err)?;
    remove_before(dir, start).map_err(err)?;
    Ok(Opened {
        store: Store {
            dir: dir.to_path_buf(),
            fingerprint: fp.clone(),
            _lock: lock,
            segment,
            segment_no: next,
            segment_len,
            segment_limit,
        },
        model,
        notes,
    })
}

fn read_snapshot(bytes: &[u8]) -> Result<(Fingerprint, Vec<DurableSession>), String> {
    let scan = frame::scan(bytes, SNAPSHOT_MAGIC).map_err(|e| e.to_string())?;
    if let Some(why) = scan.torn {
        return Err(why);
    }
    let (meta, rest) = scan.records.split_first().ok_or("no header record")?;
    let meta: Meta = serde_json::from_slice(meta).map_err(|e| e.to_string())?;
    let want = meta.sessions.ok_or("no session count")?;
    if rest.len() != want {
        return Err(format!("{} of {want} sessions", rest.len()));
    }
    let sessions = (rest.iter())
        .map(|r| serde_json::from_slice(r).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    Ok((meta.fingerprint, sessions))
}
