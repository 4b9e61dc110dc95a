//! GGUF metadata values: the typed value enum, its wire type ids, and lenient accessors that
//! accept any integer width that fits (writers disagree on e.g. u32 vs i32 token ids).

/// One metadata value, as stored in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// Wire ids of the value types (`gguf_type` in ggml).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl GgufValue {
    /// The GGUF name of this value's type (`UINT32`, `ARRAY`, …), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "UINT8",
            GgufValue::I8(_) => "INT8",
            GgufValue::U16(_) => "UINT16",
            GgufValue::I16(_) => "INT16",
            GgufValue::U32(_) => "UINT32",
            GgufValue::I32(_) => "INT32",
            GgufValue::F32(_) => "FLOAT32",
            GgufValue::Bool(_) => "BOOL",
            GgufValue::String(_) => "STRING",
            GgufValue::Array(_) => "ARRAY",
            GgufValue::U64(_) => "UINT64",
            GgufValue::I64(_) => "INT64",
            GgufValue::F64(_) => "FLOAT64",
        }
    }

    /// Any integer value, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value of any width that fits in `u32`.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer value of any width that fits in `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer value of any width that fits in `i32`.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// A float value (`FLOAT64` narrowed to f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}
