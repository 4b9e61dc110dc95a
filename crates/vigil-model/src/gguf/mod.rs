//! GGUF v2/v3 reader over a memory map: metadata, tensor infos, and zero-copy views of tensor
//! data as `WeightData` / `QMatrix`.
//!
//! - `value`: the metadata value type and its accessors.
//! - `reader`: parsing and validation of the header (nothing here trusts the file).

mod reader;
mod value;

pub use value::GgufValue;

use crate::ModelError;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vigil_kernels::{DType, QMatrix, WeightData};

/// One tensor's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub dtype: DType,
    /// Byte offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// Number of values (product of `dims`; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes of data.
    pub fn n_bytes(&self) -> u64 {
        (self.n_elements() / self.dtype.block_size() as u64)
            .saturating_mul(self.dtype.type_size() as u64)
    }
}

/// The parsed and validated header of a GGUF file, independent of how its bytes are held.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    /// Alignment of tensor data (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute byte offset of the data section in the file.
    pub data_offset: u64,
}

impl GgufHeader {
    /// Parse and validate the header of a whole GGUF file held in `bytes`; `path` only names
    /// the file in errors. Every tensor's data is checked to lie inside `bytes`.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<GgufHeader, ModelError> {
        reader::parse(bytes, path)
    }
}

/// An open GGUF file: its header plus the memory map the tensor data is viewed from.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    map: Arc<memmap2::Mmap>,
    data_offset: u64,
    alignment: u64,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and validate `path`.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; as with every mmap-based loader, the file must not be
        // truncated or rewritten while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header = GgufHeader::parse(&map, path)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_path_buf(),
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            map: Arc::new(map),
            data_offset: header.data_offset,
            alignment: header.alignment,
            by_name,
        })
    }

    /// Alignment of tensor data in this file.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// A view of exactly `info`'s data bytes. `info` must come from this file (its extent was
    /// validated at open).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> WeightData {
        WeightData::Mapped {
            map: self.map.clone(),
            offset: (self.data_offset + info.offset) as usize,
            len: info.n_bytes() as usize,
        }
    }

    fn require(&self, name: &str) -> Result<&GgufTensorInfo, ModelError> {
        self.tensor(name)
            .ok_or_else(|| ModelError::format(&self.path, format!("no tensor named '{name}'")))
    }

    /// A 2-D tensor as a matrix of `dims[1]` rows × `dims[0]` columns (a 1-D tensor is one
    /// row). Errors for 3-D and larger tensors: see `tensor_matrices`.
    pub fn tensor_matrix(&self, name: &str) -> Result<QMatrix, ModelError> {
        let info = self.require(name)?;
        let (cols, rows, rest) = split_dims(info);
        if rest != 1 {
            return Err(ModelError::format(
                &self.path,
                format!(
                    "tensor '{name}' has dimensions {:?}, not a matrix (use tensor_matrices for stacked experts)",
                    info.dims
                ),
            ));
        }
        Ok(QMatrix {
            layout: vigil_kernels::Layout::Rows,
            dtype: info.dtype,
            rows,
            cols,
            data: self.tensor_data(info),
        })
    }

    /// A 3-D tensor `[cols, rows, n]` (stacked MoE experts) as `n` matrices of `rows × cols`,
    /// each viewing its slice of the data.
    pub fn tensor_matrices(&self, name: &str) -> Result<Vec<QMatrix>, ModelError> {
        let info = self.require(name)?;
        let (cols, rows, n) = split_dims(info);
        let data = self.tensor_data(info);
        let bytes = info.dtype.bytes_for(rows * cols).unwrap_or(0);
        Ok((0..n)
            .map(|e| QMatrix {
                layout: vigil_kernels::Layout::Rows,
                dtype: info.dtype,
                rows,
                cols,
                data: data.slice(e * bytes, bytes),
            })
            .collect())
    }

    /// The whole tensor dequantized to f32 (norm weights, biases, small tensors).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let info = self.require(name)?;
        let data = self.tensor_data(info);
        vigil_kernels::quant::dequant::dequantize_to_vec(info.dtype, data.bytes())
            .map_err(|e| ModelError::format(&self.path, format!("tensor '{name}': {e}")))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// An integer value of any width that fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// An integer value of any width that fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_str())
            .collect()
    }

    /// An array whose elements are all integers that fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_i32())
            .collect()
    }

    /// An array whose elements are all integers that fit in u32.
    pub fn get_u32_array(&self, key: &str) -> Option<Vec<u32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_u32())
            .collect()
    }

    /// An array whose elements are all floats.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_f32())
            .collect()
    }

    /// `general.architecture` (`llama`, `qwen3`, `qwen3moe`, …).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
}

/// `(dims[0], dims[1], product of the rest)`, each as usize. The element count was checked to
/// fit usize when the header was parsed, so every factor does too.
fn split_dims(info: &GgufTensorInfo) -> (usize, usize, usize) {
    let dim = |i: usize| info.dims.get(i).copied().unwrap_or(1);
    let rest = info.dims.iter().skip(2).product::<u64>();
    (dim(0) as usize, dim(1) as usize, rest as usize)
}
