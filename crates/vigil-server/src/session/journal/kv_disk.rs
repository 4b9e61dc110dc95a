//! KV offload (`--kv-disk SIZE`): an idle session's KV written to disk as its cache rows
//! (f16), so a restart (or a pin dropped under memory pressure) reads it back instead of
//! recomputing the prefill. One file per session, `kv/<id>.kv`: the framing of `frame.rs`, a
//! header record (model fingerprint, row shape, tokens) and one record of rows, each with its
//! CRC; written to a temporary name and renamed, so a file is whole or absent.
//!
//! It is a cache, not the journal: a missing, torn or mismatched file only costs the
//! recompute. The files together stay under the budget: writing one evicts the least recently
//! written others, and a file that alone exceeds it is not written.

use super::frame;
use super::store::Fingerprint;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use vigil_engine::pins::PinKv;
use vigil_model::kv_cache::KvDtype;

pub const KV_MAGIC: &[u8; 8] = b"VIGILKV1";

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    fingerprint: Fingerprint,
    f16: bool,
    num_layers: usize,
    kv_dim: usize,
    tokens: Vec<u32>,
    /// `PinKv::local_from`; absent (0) when every row is whole, as in files of older builds.
    #[serde(default, skip_serializing_if = "is_zero")]
    local_from: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

pub struct KvDisk {
    dir: PathBuf,
    budget: u64,
    fingerprint: Fingerprint,
}

impl KvDisk {
    /// The KV directory under the state directory (made if missing; leftovers of an
    /// interrupted write removed).
    pub fn open(dir: &Path, budget: u64, fingerprint: Fingerprint) -> std::io::Result<KvDisk> {
        fs::create_dir_all(dir)?;
        for e in fs::read_dir(dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "tmp") {
                let _ = fs::remove_file(p);
            }
        }
        Ok(KvDisk {
            dir: dir.to_path_buf(),
            budget,
            fingerprint,
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.kv"))
    }

    /// Write `kv` as session `id`'s file (blocking); the bytes written, 0 when over budget.
    pub fn write(&self, id: &str, kv: &PinKv) -> std::io::Result<u64> {
        let header = Header {
            fingerprint: self.fingerprint.clone(),
            f16: kv.dtype == KvDtype::F16,
            num_layers: kv.num_layers,
            kv_dim: kv.kv_dim,
            tokens: kv.tokens.clone(),
            local_from: kv.local_from,
        };
        let mut buf = frame::header(KV_MAGIC).to_vec();
        frame::frame(&serde_json::to_vec(&header)?, &mut buf);
        frame::frame(&kv.rows, &mut buf);
        let size = buf.len() as u64;
        if size > self.budget {
            return Ok(0);
        }
        self.make_room(id, size)?;
        let path = self.path(id);
        let tmp = path.with_extension("kv.tmp");
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&buf)?;
            f.sync_data()?;
        }
        fs::rename(&tmp, &path)?;
        Ok(size)
    }

    /// Delete the least recently written files (not `id`'s) until `size` more bytes fit.
    fn make_room(&self, id: &str, size: u64) -> std::io::Result<()> {
        let own = self.path(id);
        let mut files = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            let p = e.path();
            if p == own || p.extension().is_none_or(|x| x != "kv") {
                continue;
            }
            let m = e.metadata()?;
            files.push((m.modified()?, m.len(), p));
        }
        let mut used: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, p) in files {
            if used + size <= self.budget {
                break;
            }
            fs::remove_file(&p)?;
            used -= len;
        }
        Ok(())
    }

    /// Session `id`'s KV, if its file is there, whole, and of this model (blocking). A file
    /// that is not is removed.
    pub fn read(&self, id: &str) -> Option<PinKv> {
        let path = self.path(id);
        let bytes = fs::read(&path).ok()?;
        match parse(&bytes, &self.fingerprint) {
            Ok(kv) => Some(kv),
            Err(why) => {
                tracing::warn!(session = id, "KV file {} not used: {why}", path.display());
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    pub fn remove(&self, id: &str) {
        let _ = fs::remove_file(self.path(id));
    }
}

fn parse(bytes: &[u8], fingerprint: &Fingerprint) -> Result<PinKv, String> {
    let scan = frame::scan(bytes, KV_MAGIC).map_err(|e| e.to_string())?;
    if let Some(why) = scan.torn {
        return Err(why);
    }
    let [header, rows] = scan.records[..] else {
        return Err(format!("{} records, not 2", scan.records.len()));
    };
    let h: Header = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    if &h.fingerprint != fingerprint {
        return Err(format!("written for model `{}`", h.fingerprint.model));
    }
    let kv = PinKv {
        tokens: h.tokens,
        rows: rows.to_vec(),
        dtype: if h.f16 { KvDtype::F16 } else { KvDtype::F32 },
        num_layers: h.num_layers,
        kv_dim: h.kv_dim,
        local_from: h.local_from,
    };
    if kv.rows.len() != kv.tokens.len() * kv.row_bytes() {
        return Err("rows do not match the tokens".into());
    }
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(n: usize, seed: u8) -> PinKv {
        PinKv {
            tokens: (0..n as u32).collect(),
            rows: (0..n * 2 * 2 * 4 * 2)
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect(),
            dtype: KvDtype::F16,
            num_layers: 2,
            kv_dim: 4,
            local_from: n / 2,
        }
    }

    fn fp(model: &str) -> Fingerprint {
        Fingerprint {
            model: model.into(),
            vocab_size: 10,
        }
    }

    #[test]
    fn files_round_trip_stay_under_budget_and_refuse_what_is_not_theirs() {
        let dir = std::env::temp_dir().join(format!("vigil-kvdisk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // Room for two files of 10 tokens (320 bytes of rows plus framing), not three.
        let disk = KvDisk::open(&dir, 900, fp("m")).unwrap();
        let a = kv(10, 3);
        assert!(disk.write("a", &a).unwrap() > 0);
        assert_eq!(disk.read("a"), Some(a.clone()));
        std::thread::sleep(std::time::Duration::from_millis(20));
        disk.write("b", &kv(10, 5)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        disk.write("c", &kv(10, 7)).unwrap();
        assert_eq!(disk.read("a"), None, "the oldest file made room");
        assert_eq!(disk.read("c"), Some(kv(10, 7)));
        assert_eq!(
            disk.write("big", &kv(40, 1)).unwrap(),
            0,
            "larger than the whole budget"
        );
        // A torn file or another model's is not used (and is removed).
        let path = dir.join("c.kv");
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        assert_eq!(disk.read("c"), None);
        assert!(!path.exists());
        KvDisk::open(&dir, 900, fp("other"))
            .unwrap()
            .write("d", &kv(3, 1))
            .unwrap();
        assert_eq!(disk.read("d"), None);
        let _ = fs::remove_dir_all(&dir);
    }
}
