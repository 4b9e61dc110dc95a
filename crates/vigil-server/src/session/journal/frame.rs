//! The on-disk framing of log segments and snapshots: a 12-byte header (8 magic bytes, then
//! the format version as a little-endian u32), then records, each `length (u32 LE) | CRC-32
//! of the payload (u32 LE) | payload`. A reader stops at the first record that is incomplete
//! or fails its checksum, and reports where the whole records end: a power cut mid-write
//! leaves such a torn tail, and everything before it is kept.

pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 12;
pub const SEGMENT_MAGIC: &[u8; 8] = b"VIGILWAL";
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"VIGILSNP";
/// No record is larger (a length above it is read as corruption, not an allocation).
pub const MAX_RECORD: usize = 1 << 30;
const FRAME_LEN: usize = 8;

pub fn header(magic: &[u8; 8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(magic);
    h[8..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Append `payload` as one record.
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// What a file holds: its whole records, where they end, and why reading stopped early.
#[derive(Debug)]
pub struct Scan<'a> {
    pub records: Vec<&'a [u8]>,
    /// Bytes of the header and the whole records.
    pub valid_len: usize,
    /// Set when bytes after `valid_len` were not a whole, intact record.
    pub torn: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("not a Vigil state file (expected magic {expected:?})")]
    Magic { expected: String },
    #[error("state format version {found}; this Vigil reads version {FORMAT_VERSION}")]
    Version { found: u32 },
}

/// Read the records of a file that should start with `magic`. A file shorter than its header
/// (torn while being created) reads as empty and torn.
pub fn scan<'a>(bytes: &'a [u8], magic: &[u8; 8]) -> Result<Scan<'a>, FrameError> {
    if bytes.len() < HEADER_LEN {
        return Ok(Scan {
            records: Vec::new(),
            valid_len: 0,
            torn: (!bytes.is_empty())
                .then(|| format!("a {}-byte file has no whole header", bytes.len())),
        });
    }
    if &bytes[..8] != magic {
        return Err(FrameError::Magic {
            expected: String::from_utf8_lossy(magic).into_owned(),
        });
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != FORMAT_VERSION {
        return Err(FrameError::Version { found: version });
    }
    let mut at = HEADER_LEN;
    let mut records = Vec::new();
    let torn = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_LEN {
            break Some(format!(
                "{} bytes of a record frame at offset {at}",
                rest.len()
            ));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD || rest.len() - FRAME_LEN < len {
            break Some(format!(
                "a record of {len} bytes at offset {at} has {} bytes",
                rest.len() - FRAME_LEN
            ));
        }
        let payload = &rest[FRAME_LEN..FRAME_LEN + len];
        if crc32fast::hash(payload) != crc {
            break Some(format!("the record at offset {at} fails its checksum"));
        }
        records.push(payload);
        at += FRAME_LEN + len;
    };
    Ok(Scan {
        records,
        valid_len: at,
        torn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(payloads: &[&[u8]]) -> Vec<u8> {
        let mut f = header(SEGMENT_MAGIC).to_vec();
        for p in payloads {
            frame(p, &mut f);
        }
        f
    }

    #[test]
    fn every_cut_of_a_file_reads_its_whole_records_and_nothing_else() {
        let payloads: [&[u8]; 4] = [b"one", b"", b"three three", &[7u8; 300]];
        let whole = file(&payloads);
        // Where each record ends.
        let mut ends = vec![HEADER_LEN];
        for p in &payloads {
            ends.push(ends.last().unwrap() + FRAME_LEN + p.len());
        }
        for cut in 0..=whole.len() {
            let s = scan(&whole[..cut], SEGMENT_MAGIC).unwrap();
            let whole_records = ends.iter().skip(1).filter(|&&e| e <= cut).count();
            assert_eq!(s.records.len(), whole_records, "cut at {cut}");
            for (r, p) in s.records.iter().zip(payloads) {
                assert_eq!(*r, p);
            }
            let at_boundary = cut == 0 || ends.contains(&cut);
            assert_eq!(s.torn.is_none(), at_boundary, "cut at {cut}: {:?}", s.torn);
            assert_eq!(
                s.valid_len,
                if cut < HEADER_LEN {
                    0
                } else {
                    ends[whole_records]
                }
            );
        }
    }

    #[test]
    fn a_flipped_byte_ends_the_records_at_the_one_it_hit() {
        let payloads: [&[u8]; 3] = [b"alpha", b"beta", b"gamma"];
        let whole = file(&payloads);
        let second = HEADER_LEN + FRAME_LEN + 5;
        for i in second..whole.len() {
            let mut bad = whole.clone();
            bad[i] ^= 0x40;
            let s = scan(&bad, SEGMENT_MAGIC).unwrap();
            assert!(s.records.len() < 3, "flip at {i}");
            assert_eq!(s.records[0], b"alpha");
            assert!(s.torn.is_some());
        }
    }

    #[test]
    fn a_foreign_file_or_a_newer_version_is_refused() {
        let mut f = file(&[b"x"]);
        assert!(matches!(
            scan(&f, SNAPSHOT_MAGIC),
            Err(FrameError::Magic { .. })
        ));
        f[8] = 9;
        assert!(matches!(
            scan(&f, SEGMENT_MAGIC),
            Err(FrameError::Version { found: 9 })
        ));
    }
}
