//! Weight storage: bytes that are either a view into a memory-mapped checkpoint or an owned,
//! 64-byte-aligned buffer (weights converted or quantized at load), and the 2-D matrix type
//! every matmul takes.

use crate::DType;
use std::sync::Arc;

/// Bytes of a tensor, borrowed from a shared memory map or owned.
#[derive(Clone)]
pub enum WeightData {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Arc<AlignedBytes>),
}

impl WeightData {
    pub fn from_vec_f32(v: &[f32]) -> Self {
        WeightData::Owned(Arc::new(AlignedBytes::from_bytes(bytemuck::cast_slice(v))))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            WeightData::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            WeightData::Owned(b) => b.as_bytes(),
        }
    }

    /// A sub-range of these bytes sharing the same backing storage.
    pub fn slice(&self, start: usize, len: usize) -> WeightData {
        assert!(
            start + len <= self.bytes().len(),
            "weight slice out of range"
        );
        match self {
            WeightData::Mapped { map, offset, .. } => WeightData::Mapped {
                map: map.clone(),
                offset: offset + start,
                len,
            },
            WeightData::Owned(b) => WeightData::Owned(Arc::new(AlignedBytes::from_bytes(
                &b.as_bytes()[start..start + len],
            ))),
        }
    }
}

impl std::fmt::Debug for WeightData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightData({} bytes)", self.bytes().len())
    }
}

/// A byte buffer aligned to 64 bytes, so any block type can be viewed in place.
pub struct AlignedBytes {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            words: vec![[0u64; 8]; len.div_ceil(64)],
            len,
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_bytes_mut().copy_from_slice(bytes);
        b
    }

    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<[u64; 8], u8>(&self.words)[..self.len]
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<[u64; 8], u8>(&mut self.words)[..self.len]
    }
}

/// A row-major weight matrix of `rows` outputs × `cols` inputs (PyTorch `[out, in]`, GGUF
/// `ne = [cols, rows]`), each row `cols / block_size` blocks of `dtype`.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
}

impl QMatrix {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data.bytes()[r * n..(r + 1) * n]
    }
}
