//! Bad GGUF files are errors that name the file and the problem — never panics, never huge
//! allocations: truncation at every byte of the small fixture, targeted corruptions of its
//! header, hand-built files for each validation rule, and a deterministic mini-fuzz.

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use vigil_kernels::quant::dequant::dequantize;
use vigil_model::gguf::{GgufFile, GgufHeader};
use vigil_model::ModelError;

fn small() -> Vec<u8> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/small.gguf");
    std::fs::read(path).unwrap()
}

/// Write `bytes` to a temporary file, open it, and return the error's message; asserts the
/// message names the file and contains every one of `needles`.
fn open_err(tag: &str, bytes: &[u8], needles: &[&str]) -> ModelError {
    let path = std::env::temp_dir().join(format!(
        "vigil-gguf-corrupt-{}-{tag}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    let result = GgufFile::open(&path);
    std::fs::remove_file(&path).ok();
    let err = match result {
        Ok(_) => panic!("{tag}: corrupt file parsed"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(msg.contains(path.to_str().unwrap()), "{tag}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "{tag}: expected {n:?} in {msg:?}");
    }
    err
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in fixture", String::from_utf8_lossy(needle)))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte position just after the key string `key` in the fixture (where its value type is).
fn after_key(b: &[u8], key: &str) -> usize {
    let mut with_len = (key.len() as u64).to_le_bytes().to_vec();
    with_len.extend_from_slice(key.as_bytes());
    find(b, &with_len) + with_len.len()
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let bytes = small();
    let path = Path::new("small.gguf");
    let full = GgufHeader::parse(&bytes, path).unwrap();
    // The writer pads the last tensor; cutting only padding leaves a valid file.
    let data_end = full
        .tensors
        .iter()
        .map(|t| full.data_offset + t.offset + t.n_bytes())
        .max()
        .unwrap() as usize;
    for len in 0..bytes.len() {
        let r = GgufHeader::parse(&bytes[..len], path);
        if len < data_end {
            let msg = r.expect_err("truncated file parsed").to_string();
            assert!(msg.starts_with("small.gguf: "), "{msg}");
        } else {
            assert!(r.is_ok(), "only padding was cut at {len}");
        }
    }
    open_err("empty", &[], &["truncated"]);
    open_err("cut", &bytes[..bytes.len() / 2], &[]);
}

#[test]
fn bad_magic_and_versions() {
    let good = small();
    let mut b = good.clone();
    b[0..4].copy_from_slice(b"GGML");
    open_err("magic", &b, &["not a GGUF file", "magic"]);

    let mut b = good.clone();
    put_u32(&mut b, 4, 1);
    let e = open_err("v1", &b, &["version 1", "not supported"]);
    assert!(matches!(e, ModelError::Unsupported { .. }));

    let mut b = good.clone();
    put_u32(&mut b, 4, 7);
    open_err("v7", &b, &["version 7", "not supported"]);

    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    let e = open_err("big-endian", &b, &["big-endian", "not supported"]);
    assert!(matches!(e, ModelError::Unsupported { .. }));
}

#[test]
fn impossible_counts() {
    let good = small();
    for (tag, v) in [("max", u64::MAX), ("huge", 1 << 40), ("over", 4096)] {
        let mut b = good.clone();
        put_u64(&mut b, 8, v);
        open_err(
            &format!("tensors-{tag}"),
            &b,
            &["tensor count", &v.to_string()],
        );
        let mut b = good.clone();
        put_u64(&mut b, 16, v);
        open_err(
            &format!("kvs-{tag}"),
            &b,
            &["metadata count", &v.to_string()],
        );
    }
    // One more tensor than there is: the extra "info" is read from the padding/data and fails.
    let mut b = good.clone();
    put_u64(&mut b, 8, 12);
    open_err("tensors+1", &b, &["tensor info 11"]);
}

#[test]
fn bad_string_lengths() {
    let good = small();
    // The key length of the first entry.
    let mut b = good.clone();
    put_u64(&mut b, 24, u64::MAX);
    open_err("key-len", &b, &["metadata entry 0", "key", "length"]);
    // The length of a string value.
    let mut b = good.clone();
    let at = after_key(&good, "test.string") + 4;
    put_u64(&mut b, at, 1 << 50);
    open_err("value-len", &b, &["test.string", "length 1125899906842624"]);
    // A string in an array of strings.
    let mut b = good.clone();
    let at = after_key(&good, "test.arr_str") + 4 + 4 + 8;
    put_u64(&mut b, at, good.len() as u64);
    open_err(
        "array-string-len",
        &b,
        &["test.arr_str", "element 0", "length"],
    );
    // Invalid UTF-8 in a key.
    let mut b = good.clone();
    let at = after_key(&good, "test.u8") - 2;
    b[at] = 0xFF;
    open_err("utf8", &b, &["UTF-8"]);
}

#[test]
fn bad_type_ids_and_array_lengths() {
    let good = small();
    let mut b = good.clone();
    put_u32(&mut b, after_key(&good, "test.u8"), 99);
    open_err(
        "value-type",
        &b,
        &["test.u8", "unknown metadata value type 99"],
    );

    let mut b = good.clone();
    put_u32(&mut b, after_key(&good, "test.arr_u8") + 4, 13);
    open_err(
        "elem-type",
        &b,
        &["test.arr_u8", "unknown element value type 13"],
    );

    for v in [u64::MAX, 1 << 60, good.len() as u64] {
        let mut b = good.clone();
        put_u64(&mut b, after_key(&good, "test.arr_u64") + 8, v);
        open_err(
            "array-len",
            &b,
            &["test.arr_u64", &format!("array length {v}")],
        );
    }

    let mut b = good.clone();
    b[after_key(&good, "test.bool_true") + 4] = 7;
    open_err("bool", &b, &["test.bool_true", "invalid value 7"]);

    // Tensor type: Q4_K (12) → Q2_K (10), unsupported, named with the tensor.
    let mut b = good.clone();
    let at = after_key(&good, "q4_k.weight") + 4 + 2 * 8;
    assert_eq!(b[at..at + 4], 12u32.to_le_bytes());
    put_u32(&mut b, at, 10);
    let e = open_err("tensor-type", &b, &["q4_k.weight", "type 10", "Q2_K"]);
    assert!(matches!(e, ModelError::Unsupported { .. }));
    put_u32(&mut b, at, 1000);
    open_err("tensor-type-unknown", &b, &["q4_k.weight", "type 1000"]);
}

#[test]
fn bad_tensor_offsets_and_dims() {
    let good = small();
    let q4k = after_key(&good, "q4_k.weight"); // n_dims, dims[2], type, offset
    let offset_at = q4k + 4 + 2 * 8 + 4;
    let offset = u64::from_le_bytes(good[offset_at..offset_at + 8].try_into().unwrap());

    let mut b = good.clone();
    put_u64(&mut b, offset_at, offset + 1);
    open_err(
        "misaligned",
        &b,
        &["q4_k.weight", "not a multiple of the alignment 64"],
    );

    let mut b = good.clone();
    put_u64(&mut b, offset_at, offset + 64);
    open_err("overlap", &b, &["overlap", "q4_k.weight"]);

    for v in [u64::MAX - 63, 1 << 40, good.len() as u64] {
        let mut b = good.clone();
        put_u64(&mut b, offset_at, v);
        open_err("outside", &b, &["q4_k.weight", "outside the file"]);
    }

    let mut b = good.clone();
    put_u64(&mut b, q4k + 4, 128);
    open_err(
        "block-multiple",
        &b,
        &["q4_k.weight", "first dimension 128", "256"],
    );

    let mut b = good.clone();
    put_u64(&mut b, q4k + 4 + 8, u64::MAX);
    open_err("dims-overflow", &b, &["q4_k.weight", "overflows"]);

    let mut b = good.clone();
    put_u64(&mut b, q4k + 4 + 8, 1 << 40);
    open_err("dims-outside", &b, &["q4_k.weight", "outside the file"]);

    let mut b = good.clone();
    put_u32(&mut b, q4k, 9);
    open_err("n-dims", &b, &["q4_k.weight", "9 dimensions"]);
}

/// Builds GGUF v3 files for rules the Python writer cannot violate.
#[derive(Default)]
struct Builder {
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

fn gguf_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Builder {
    fn kv(mut self, key: &str, value_type: u32, value: &[u8]) -> Self {
        gguf_string(&mut self.kvs, key);
        self.kvs.extend_from_slice(&value_type.to_le_bytes());
        self.kvs.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Self {
        gguf_string(&mut self.infos, name);
        self.infos
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ggml_type.to_le_bytes());
        self.infos.extend_from_slice(&offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    fn data(mut self, n: usize) -> Self {
        self.data = vec![0; n];
        self
    }

    fn build(&self, alignment: usize) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&self.n_tensors.to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kvs);
        b.extend_from_slice(&self.infos);
        b.resize(b.len().div_ceil(alignment) * alignment, 0);
        b.extend_from_slice(&self.data);
        b
    }
}

const U32: u32 = 4;
const ARRAY: u32 = 9;

#[test]
fn hand_built_violations() {
    let ok = Builder::default()
        .kv("a", U32, &1u32.to_le_bytes())
        .tensor("t", &[32], 0, 0)
        .data(128);
    assert!(GgufHeader::parse(&ok.build(32), Path::new("x")).is_ok());

    let b = Builder::default()
        .kv("a", U32, &1u32.to_le_bytes())
        .kv("a", U32, &2u32.to_le_bytes());
    open_err("dup-key", &b.build(32), &["duplicate metadata key 'a'"]);

    let b = Builder::default()
        .tensor("t", &[32], 0, 0)
        .tensor("t", &[32], 0, 128)
        .data(256);
    open_err("dup-tensor", &b.build(32), &["duplicate tensor name 't'"]);

    let b = Builder::default()
        .tensor("a", &[32], 0, 0)
        .tensor("b", &[32], 0, 96)
        .data(256);
    open_err("overlap", &b.build(32), &["tensors 'a' and 'b' overlap"]);

    for bad in [0u32, 3, 48] {
        let b = Builder::default().kv("general.alignment", U32, &bad.to_le_bytes());
        open_err(
            "alignment",
            &b.build(32),
            &[&format!("general.alignment {bad} is not a power of two")],
        );
    }
    let b = Builder::default().kv("general.alignment", 8, &[1, 0, 0, 0, 0, 0, 0, 0, b'x']);
    open_err(
        "alignment-type",
        &b.build(32),
        &["general.alignment must be"],
    );

    // A valid non-default alignment moves the data section.
    let b = Builder::default()
        .kv("general.alignment", U32, &256u32.to_le_bytes())
        .tensor("t", &[32], 0, 0)
        .data(128);
    let h = GgufHeader::parse(&b.build(256), Path::new("x")).unwrap();
    assert_eq!((h.alignment, h.data_offset), (256, 256));

    // Arrays of arrays nested 20 deep.
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend_from_slice(&ARRAY.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&U32.to_le_bytes());
    nested.extend_from_slice(&1u64.to_le_bytes());
    nested.extend_from_slice(&5u32.to_le_bytes());
    let b = Builder::default().kv("deep", ARRAY, &nested);
    open_err("depth", &b.build(32), &["'deep'", "nested deeper than"]);

    // A 0-dimensional tensor is a scalar; of a block type it is not a whole block.
    let b = Builder::default().tensor("s", &[], 0, 0).data(32);
    let h = GgufHeader::parse(&b.build(32), Path::new("x")).unwrap();
    assert_eq!(h.tensors[0].n_bytes(), 4);
    let b = Builder::default().tensor("s", &[], 8, 0).data(64);
    open_err("scalar-q8", &b.build(32), &["'s'", "block size 32"]);
}

/// Mutate the fixture 2000 ways (byte flips, random bytes, u32/u64 fields set to extremes,
/// truncation); parsing must never panic, and what does parse must dequantize without panic.
#[test]
fn mini_fuzz_never_panics() {
    let good = small();
    let path = Path::new("fuzz.gguf");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6767_7566);
    let mut parsed = 0;
    for _ in 0..2000 {
        let mut b = good.clone();
        // Mutations concentrate in the header, where the structure is.
        let header_end = 2048;
        for _ in 0..rng.random_range(1..=4) {
            let limit = header_end.min(b.len());
            if limit == 0 {
                break;
            }
            let at = rng.random_range(0..limit);
            match rng.random_range(0..5) {
                0 => b[at] ^= 1 << rng.random_range(0..8),
                1 => b[at] = rng.random(),
                2 if at + 4 <= b.len() => {
                    let v = [0, 1, u32::MAX, 0x8000_0000, rng.random()][rng.random_range(0..5)];
                    put_u32(&mut b, at, v);
                }
                3 if at + 8 <= b.len() => {
                    let v = [0, u64::MAX, 1 << 32, 1 << 63, rng.random()][rng.random_range(0..5)];
                    put_u64(&mut b, at, v);
                }
                _ => b.truncate(rng.random_range(0..limit)),
            }
        }
        if let Ok(h) = GgufHeader::parse(&b, path) {
            parsed += 1;
            for t in &h.tensors {
                let start = (h.data_offset + t.offset) as usize;
                let bytes = &b[start..start + t.n_bytes() as usize];
                let mut out = vec![0.0; t.n_elements() as usize];
                dequantize(t.dtype, bytes, &mut out).unwrap();
            }
        }
    }
    // Sanity: some mutations (e.g. in string contents) leave a valid file.
    assert!(parsed > 0);
}

/// A corrupt array length that fits in the file (1 byte per `u8`) would decode the whole file
/// as 32-byte values; the per-file element budget stops it before it allocates.
#[test]
fn array_element_budget() {
    let mut arr = 0u32.to_le_bytes().to_vec(); // element type u8
    arr.extend_from_slice(&(1u64 << 25).to_le_bytes());
    let b = Builder::default().kv("big", ARRAY, &arr).data(1 << 25);
    open_err("budget", &b.build(32), &["'big'", "exceeds the limit"]);
}
