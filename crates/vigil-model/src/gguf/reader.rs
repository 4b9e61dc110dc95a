//! Parsing and validation of a GGUF header (magic, version, metadata, tensor infos) from a
//! byte slice. File contents are untrusted: every count and length is checked against the
//! bytes that remain before anything is allocated for it, and every tensor's extent is checked
//! against the file, the alignment and the other tensors.

use super::value::{type_id, GgufValue};
use super::{GgufHeader, GgufTensorInfo};
use crate::ModelError;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use vigil_kernels::DType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Metadata arrays may nest (an array of arrays); deeper than this is corrupt, not data.
const MAX_ARRAY_DEPTH: usize = 8;
/// Total metadata array elements per file. A decoded value takes 32 bytes however few it
/// took in the file, so a corrupt length that happens to fit in the file must not be allowed
/// to decode gigabytes of tensor data as a `u8` array. Real vocabularies (tokens, merges,
/// types, scores) total under a million.
const MAX_ARRAY_ELEMENTS: u64 = 1 << 24;
/// Initial capacity cap, so a count is only trusted as far as entries are actually read.
const MAX_PREALLOCATED_ELEMENTS: u64 = 1 << 16;
/// Smallest possible encodings, used to bound counts by the bytes that remain.
const MIN_KV_BYTES: u64 = 8 + 4 + 1; // key length, value type, 1-byte value
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8; // name length, n_dims, type, offset

/// A problem found while parsing; becomes a `ModelError` naming the file at the top.
#[derive(Debug)]
enum Problem {
    Format(String),
    Unsupported(String),
}

impl Problem {
    fn context(self, ctx: impl std::fmt::Display) -> Problem {
        match self {
            Problem::Format(m) => Problem::Format(format!("{ctx}: {m}")),
            Problem::Unsupported(m) => Problem::Unsupported(format!("{ctx}: {m}")),
        }
    }

    fn into_error(self, path: &Path) -> ModelError {
        match self {
            Problem::Format(m) => ModelError::format(path, m),
            Problem::Unsupported(m) => ModelError::unsupported(path, m),
        }
    }
}

type PResult<T> = Result<T, Problem>;

fn format_err<T>(msg: impl Into<String>) -> PResult<T> {
    Err(Problem::Format(msg.into()))
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Metadata array elements that may still be decoded (`MAX_ARRAY_ELEMENTS` budget).
    elements_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> PResult<&'a [u8]> {
        if n > self.remaining() {
            return format_err(format!(
                "truncated: {what} at byte {} needs {n} bytes but only {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> PResult<[u8; N]> {
        let b = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> PResult<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> PResult<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> PResult<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return format_err(format!(
                "{what} at byte {at} has length {len}, more than the {} bytes remaining",
                self.remaining()
            ));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => format_err(format!("{what} at byte {at} is not valid UTF-8")),
        }
    }
}

/// Bytes of the smallest value of a wire type (to bound array lengths); `None` if unknown.
fn min_value_bytes(t: u32) -> Option<u64> {
    Some(match t {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
        type_id::ARRAY => 4 + 8,
        _ => return None,
    })
}

fn read_value(c: &mut Cursor, t: u32, depth: usize) -> PResult<GgufValue> {
    let what = "value";
    Ok(match t {
        type_id::U8 => GgufValue::U8(u8::from_le_bytes(c.array(what)?)),
        type_id::I8 => GgufValue::I8(i8::from_le_bytes(c.array(what)?)),
        type_id::U16 => GgufValue::U16(u16::from_le_bytes(c.array(what)?)),
        type_id::I16 => GgufValue::I16(i16::from_le_bytes(c.array(what)?)),
        type_id::U32 => GgufValue::U32(u32::from_le_bytes(c.array(what)?)),
        type_id::I32 => GgufValue::I32(i32::from_le_bytes(c.array(what)?)),
        type_id::F32 => GgufValue::F32(f32::from_le_bytes(c.array(what)?)),
        type_id::U64 => GgufValue::U64(u64::from_le_bytes(c.array(what)?)),
        type_id::I64 => GgufValue::I64(i64::from_le_bytes(c.array(what)?)),
        type_id::F64 => GgufValue::F64(f64::from_le_bytes(c.array(what)?)),
        type_id::BOOL => {
            let at = c.pos;
            match c.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return format_err(format!("bool at byte {at} has invalid value {b}")),
            }
        }
        type_id::STRING => GgufValue::String(c.string("string value")?),
        type_id::ARRAY => read_array(c, depth + 1)?,
        _ => return format_err(format!("unknown metadata value type {t}")),
    })
}

fn read_array(c: &mut Cursor, depth: usize) -> PResult<GgufValue> {
    if depth > MAX_ARRAY_DEPTH {
        return format_err(format!(
            "arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
        ));
    }
    let at = c.pos;
    let elem_type = c.u32("array element type")?;
    let Some(min) = min_value_bytes(elem_type) else {
        return format_err(format!(
            "array at byte {at} has unknown element value type {elem_type}"
        ));
    };
    let len = c.u64("array length")?;
    if len.checked_mul(min).is_none_or(|n| n > c.remaining()) {
        return format_err(format!(
            "array length {len} at byte {at} is impossible: the {} bytes remaining hold fewer elements",
            c.remaining()
        ));
    }
    if len > c.elements_left {
        return format_err(format!(
            "array length {len} at byte {at} exceeds the limit of {MAX_ARRAY_ELEMENTS} metadata array elements per file"
        ));
    }
    c.elements_left -= len;
    let mut items = Vec::with_capacity(len.min(MAX_PREALLOCATED_ELEMENTS) as usize);
    for i in 0..len {
        let v = read_value(c, elem_type, depth).map_err(|p| p.context(format!("element {i}")))?;
        items.push(v);
    }
    Ok(GgufValue::Array(items))
}

/// The GGML name of a tensor type id, for messages about unsupported types.
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        4 | 5 => "Q4_2/Q4_3 (removed)",
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

fn read_tensor_info(c: &mut Cursor) -> PResult<GgufTensorInfo> {
    let name = c.string("tensor name")?;
    let in_tensor = |p: Problem| p.context(format!("tensor '{name}'"));
    let n_dims = c.u32("dimension count").map_err(in_tensor)?;
    if n_dims > MAX_DIMS {
        return Err(in_tensor(Problem::Format(format!(
            "{n_dims} dimensions (at most {MAX_DIMS})"
        ))));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("dimension").map_err(in_tensor)?);
    }
    let type_id = c.u32("tensor type").map_err(in_tensor)?;
    let offset = c.u64("tensor data offset").map_err(in_tensor)?;
    let Some(dtype) = DType::from_ggml_type(type_id) else {
        return Err(in_tensor(Problem::Unsupported(format!(
            "ggml tensor type {type_id} ({}) is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)",
            ggml_type_name(type_id)
        ))));
    };
    let info = GgufTensorInfo {
        name,
        dims,
        dtype,
        offset,
    };
    check_shape(&info).map_err(|p| p.context(format!("tensor '{}'", info.name)))?;
    Ok(info)
}

/// Element count and byte size fit in u64/usize and the rows are whole blocks.
fn check_shape(info: &GgufTensorInfo) -> PResult<()> {
    let dims = &info.dims;
    let n = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let Some(n) = n.filter(|&n| usize::try_from(n).is_ok()) else {
        return format_err(format!("element count of dimensions {dims:?} overflows"));
    };
    let inner = dims.first().copied().unwrap_or(1);
    let block = info.dtype.block_size() as u64;
    if !inner.is_multiple_of(block) {
        return format_err(format!(
            "first dimension {inner} of a {} tensor is not a multiple of its block size {block}",
            info.dtype
        ));
    }
    if (n / block)
        .checked_mul(info.dtype.type_size() as u64)
        .is_none()
    {
        return format_err(format!("byte size of dimensions {dims:?} overflows"));
    }
    Ok(())
}

fn read_alignment(metadata: &BTreeMap<String, GgufValue>) -> PResult<u64> {
    let Some(v) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_u32() {
        Some(a) if a.is_power_of_two() => Ok(a.into()),
        Some(a) => format_err(format!("general.alignment {a} is not a power of two")),
        None => format_err(format!(
            "general.alignment must be an unsigned 32-bit integer, found {} {v:?}",
            v.type_name()
        )),
    }
}

/// Every tensor lies inside the file, starts on an alignment boundary and overlaps no other.
fn check_extents(
    tensors: &[GgufTensorInfo],
    data_offset: u64,
    file_len: u64,
    alignment: u64,
) -> PResult<()> {
    let mut extents = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return format_err(format!(
                "tensor '{}' data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        let size = t.n_bytes();
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => extents.push((start, end, &t.name)),
            _ => {
                return format_err(format!(
                    "tensor '{}' data ({size} bytes at data offset {}, data section at byte {data_offset}) lies outside the file ({file_len} bytes)",
                    t.name, t.offset
                ))
            }
        }
    }
    extents.retain(|&(s, e, _)| e > s);
    extents.sort_unstable();
    for w in extents.windows(2) {
        let ((_, end_a, a), (start_b, _, b)) = (w[0], w[1]);
        if start_b < end_a {
            return format_err(format!("tensors '{a}' and '{b}' overlap"));
        }
    }
    Ok(())
}

fn read_header(bytes: &[u8]) -> PResult<GgufHeader> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        elements_left: MAX_ARRAY_ELEMENTS,
    };
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return format_err(format!(
            "not a GGUF file: magic is {magic:02x?}, expected \"GGUF\""
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(Problem::Unsupported(
                "GGUF version 1 is not supported (only versions 2 and 3); re-convert the model".into(),
            ))
        }
        v if (1..=3).contains(&v.swap_bytes()) => {
            return Err(Problem::Unsupported(format!(
                "big-endian GGUF (version field {v:#010x}, version {} when read big-endian) is not supported",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(Problem::Unsupported(format!(
                "GGUF version {v} is not supported (only versions 2 and 3)"
            )))
        }
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata count")?;
    let file_len = bytes.len() as u64;
    if kv_count
        .checked_mul(MIN_KV_BYTES)
        .is_none_or(|n| n > c.remaining())
    {
        return format_err(format!(
            "metadata count {kv_count} is impossible for a file of {file_len} bytes"
        ));
    }
    if tensor_count
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .is_none_or(|n| n > c.remaining())
    {
        return format_err(format!(
            "tensor count {tensor_count} is impossible for a file of {file_len} bytes"
        ));
    }

    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = c
            .string("key")
            .map_err(|p| p.context(format!("metadata entry {i}")))?;
        let in_entry = |p: Problem| p.context(format!("metadata entry {i} ('{key}')"));
        let t = c.u32("value type").map_err(in_entry)?;
        let value = read_value(&mut c, t, 0).map_err(in_entry)?;
        if metadata.contains_key(&key) {
            return format_err(format!("duplicate metadata key '{key}'"));
        }
        metadata.insert(key, value);
    }
    let alignment = read_alignment(&metadata)?;

    if tensor_count
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .is_none_or(|n| n > c.remaining())
    {
        return format_err(format!(
            "tensor count {tensor_count} is impossible: only {} bytes follow the metadata",
            c.remaining()
        ));
    }
    let capacity = tensor_count.min(MAX_PREALLOCATED_ELEMENTS) as usize;
    let mut tensors = Vec::with_capacity(capacity);
    let mut names = HashSet::with_capacity(capacity);
    for i in 0..tensor_count {
        let info = read_tensor_info(&mut c).map_err(|p| p.context(format!("tensor info {i}")))?;
        if !names.insert(info.name.clone()) {
            return format_err(format!("duplicate tensor name '{}'", info.name));
        }
        tensors.push(info);
    }

    let end_of_header = c.pos as u64;
    let data_offset = end_of_header.div_ceil(alignment) * alignment;
    check_extents(&tensors, data_offset, file_len, alignment)?;
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

pub(super) fn parse(bytes: &[u8], path: &Path) -> Result<GgufHeader, ModelError> {
    read_header(bytes).map_err(|p| p.into_error(path))
}
