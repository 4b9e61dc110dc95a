//! Weight storage: bytes that are either a view into a memory map (the checkpoint's resident
//! copy, or the file itself with `VIGIL_MMAP=1`) or an owned, 64-byte-aligned buffer (weights
//! converted or quantized at load), and the 2-D matrix type every matmul takes.

use crate::DType;
use std::sync::Arc;

/// Whether checkpoints are served from their file mapping (`VIGIL_MMAP=1`) instead of a
/// resident copy (`resident_map`).
pub fn keep_mapped() -> bool {
    std::env::var("VIGIL_MMAP").is_ok_and(|v| v == "1")
}

/// One read-only buffer of `len` bytes in anonymous memory asked for in transparent huge
/// pages, holding each `(offset, bytes)` of `parts` at its offset.
///
/// Decode streams every weight once per token: from the page cache's 4 KiB pages that is a
/// TLB miss every 4 KiB, and the page walks showed in decode at depth (SmolLM2 Q4_0, tg64
/// after 2,048 tokens, 8-14 % faster from a copy). Where the kernel gives no huge pages the
/// copy is still correct, only not faster.
pub fn resident_copy(len: usize, parts: &[(usize, &[u8])]) -> std::io::Result<memmap2::Mmap> {
    let mut anon = resident_map(len)?;
    for &(offset, bytes) in parts {
        anon[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
    anon.make_read_only()
}

/// `len` bytes of zeroed anonymous memory asked for in transparent huge pages, to be written
/// and then made read-only (`resident_copy`'s buffer, or one the caller fills in place).
pub fn resident_map(len: usize) -> std::io::Result<memmap2::MmapMut> {
    let anon = memmap2::MmapMut::map_anon(len.max(1))?;
    // A hint, asked before the pages are touched; THP "always" does not need it.
    #[cfg(target_os = "linux")]
    let _ = anon.advise(memmap2::Advice::HugePage);
    Ok(anon)
}

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

/// How a matrix's blocks are ordered in its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Row after row, as in the checkpoint.
    #[default]
    Rows,
    /// Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K, F32 / F16 / BF16 only: groups of 8 rows, block by
    /// block (`BlockQ4_0x8`, `BlockQ4_1x8`, `BlockQ8_0x8`, `BlockQ4Kx8`, `BlockQ5Kx8`) or 8
    /// values of each row in turn (floats),
    /// the last group padded with zero rows. Made at load by `quant::interleave` for the
    /// kernels.
    Interleaved8,
    /// BF16 only: `Interleaved8`'s groups with each value's high byte a 4-bit code into a
    /// table, 12 bits a value, the same values (`quant::packed_bf16`). Made at load.
    PackedBf16,
}

/// A weight matrix of `rows` outputs × `cols` inputs (PyTorch `[out, in]`, GGUF
/// `ne = [cols, rows]`), each row `cols / block_size` blocks of `dtype`, stored as `layout`
/// says.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
    pub layout: Layout,
}

impl QMatrix {
    /// A matrix stored row after row (as every checkpoint stores it).
    pub fn new(dtype: DType, rows: usize, cols: usize, data: WeightData) -> Self {
        QMatrix {
            dtype,
            rows,
            cols,
            data,
            layout: Layout::Rows,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    /// Row `r`'s bytes, in place (`Layout::Rows` only; `quant::dequant::dequantize_row`
    /// reads either layout).
    ///
    /// # Panics
    /// On an interleaved matrix, whose rows are not contiguous.
    pub fn row(&self, r: usize) -> &[u8] {
        assert_eq!(
            self.layout,
            Layout::Rows,
            "QMatrix::row on an interleaved matrix"
        );
        let n = self.row_bytes();
        &self.data.bytes()[r * n..(r + 1) * n]
    }
}
