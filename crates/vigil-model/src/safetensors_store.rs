//! The tensors of an HF checkpoint directory: every safetensors shard memory-mapped once,
//! found through `model.safetensors` or `model.safetensors.index.json`. Tensors are views
//! into the maps; nothing is copied unless a tensor's bytes are misaligned for its type.

use crate::error::ModelError;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

struct Shard {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
}

/// Where one tensor lives: its shard and its byte range within that shard's map.
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    offset: usize,
    len: usize,
}

/// All tensors of a checkpoint, by name.
pub struct SafetensorsStore {
    /// The checkpoint directory, named by errors about tensors that are absent.
    dir: PathBuf,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Entry>,
}

/// One tensor: a view of its bytes in the map, with the format to read them.
#[derive(Debug, Clone)]
pub struct HfTensor {
    pub name: String,
    /// The shard it came from, for error messages.
    pub file: PathBuf,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: WeightData,
}

impl SafetensorsStore {
    /// Map the checkpoint in `dir`: the shards listed by `model.safetensors.index.json` when
    /// present, else `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        if index_path.exists() {
            Self::open_sharded(dir, &index_path)
        } else if single_path.exists() {
            Self::from_files(&[single_path])
        } else {
            Err(ModelError::format(
                dir,
                format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
            ))
        }
    }

    /// Map the given safetensors files as one checkpoint (tensor names must be unique).
    pub fn from_files(files: &[PathBuf]) -> Result<Self, ModelError> {
        let dir = files
            .first()
            .and_then(|f| f.parent())
            .map_or_else(PathBuf::new, Path::to_path_buf);
        let mut store = SafetensorsStore {
            dir,
            shards: Vec::with_capacity(files.len()),
            tensors: BTreeMap::new(),
        };
        for path in files {
            store.add_shard(path)?;
        }
        Ok(store)
    }

    fn open_sharded(dir: &Path, index_path: &Path) -> Result<Self, ModelError> {
        let weight_map = read_weight_map(index_path)?;
        let mut files: Vec<&str> = weight_map.values().map(String::as_str).collect();
        files.sort_unstable();
        files.dedup();
        let mut paths = Vec::with_capacity(files.len());
        for file in files {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(ModelError::format(
                    index_path,
                    format!("shard {file} listed in weight_map does not exist"),
                ));
            }
            paths.push(path);
        }
        let store = Self::from_files(&paths)?;
        for (name, file) in &weight_map {
            let found = store
                .tensors
                .get(name)
                .and_then(|e| store.shards.get(e.shard));
            if found.is_none_or(|s| s.path != dir.join(file)) {
                return Err(ModelError::format(
                    index_path,
                    format!("tensor {name} is listed in {file} but that shard does not hold it"),
                ));
            }
        }
        Ok(store)
    }

    fn add_shard(&mut self, path: &Path) -> Result<(), ModelError> {
        let io_err = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely on checkpoint files
        // not being modified while the model is loaded.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        // Validates the header JSON, that tensor ranges are contiguous and sized by dtype × shape,
        // and that the file is exactly header + data (so a truncated file is caught here).
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| {
            let what = match e {
                SafeTensorError::MetadataIncompleteBuffer => {
                    "its size does not match the header (truncated or trailing bytes)".to_string()
                }
                e => e.to_string(),
            };
            ModelError::format(
                path,
                format!("invalid safetensors file ({} bytes): {what}", map.len()),
            )
        })?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            let (begin, end) = info.data_offsets;
            let offset = data_start + begin;
            if end < begin || offset + (end - begin) > map.len() {
                return Err(ModelError::format(
                    path,
                    format!("tensor {name}: data offsets {begin}..{end} out of range"),
                ));
            }
            if let Some(prev) = self.tensors.get(&name) {
                let other = self
                    .shards
                    .get(prev.shard)
                    .map_or(Path::new("?"), |s| &s.path);
                return Err(ModelError::format(
                    path,
                    format!("tensor {name} is also in {}", other.display()),
                ));
            }
            self.tensors.insert(
                name,
                Entry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset,
                    len: end - begin,
                },
            );
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            map: Arc::new(map),
        });
        Ok(())
    }

    /// Tensor names in sorted order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shard files, in the order they were mapped.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// A view of tensor `name`; errors name the tensor and its file.
    pub fn tensor(&self, name: &str) -> Result<HfTensor, ModelError> {
        let found = self
            .tensors
            .get(name)
            .and_then(|e| Some((e, self.shards.get(e.shard)?)));
        let Some((entry, shard)) = found else {
            return Err(ModelError::format(
                &self.dir,
                format!("tensor {name} not found in the checkpoint"),
            ));
        };
        let dtype = match entry.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                return Err(ModelError::unsupported(
                    &shard.path,
                    format!("tensor {name} has dtype {other:?} (supported: F32, F16, BF16)"),
                ))
            }
        };
        let mapped = WeightData::Mapped {
            map: shard.map.clone(),
            offset: entry.offset,
            len: entry.len,
        };
        // Kernels view F32/F16/BF16 bytes as typed slices; a header whose length is not a
        // multiple of the element size would leave them misaligned, so copy those.
        let data = if entry.offset % dtype.type_size() == 0 {
            mapped
        } else {
            WeightData::Owned(Arc::new(AlignedBytes::from_bytes(mapped.bytes())))
        };
        Ok(HfTensor {
            name: name.to_string(),
            file: shard.path.clone(),
            dtype,
            shape: entry.shape.clone(),
            data,
        })
    }
}

impl HfTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The tensor as a `[rows, cols]` matrix (PyTorch `[out, in]`), sharing the mapped bytes.
    pub fn to_matrix(&self) -> Result<QMatrix, ModelError> {
        match self.shape.as_slice() {
            &[rows, cols] => Ok(QMatrix {
                layout: vigil_kernels::Layout::Rows,
                dtype: self.dtype,
                rows,
                cols,
                data: self.data.clone(),
            }),
            shape => Err(ModelError::format(
                &self.file,
                format!(
                    "tensor {}: expected a 2-D matrix, shape is {shape:?}",
                    self.name
                ),
            )),
        }
    }

    /// All values widened to f32 (for norms and other small tensors).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let bytes = self.data.bytes();
        match self.dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            // `SafetensorsStore::tensor` only builds F32, F16 and BF16 tensors.
            _ => Vec::new(),
        }
    }
}

/// `weight_map` of an index file: tensor name → shard file name (a plain name in the same dir).
fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    let text = std::fs::read_to_string(index_path).map_err(|source| ModelError::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::format(index_path, format!("invalid JSON: {e}")))?;
    let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(ModelError::format(
            index_path,
            "weight_map: missing or not an object",
        ));
    };
    map.iter()
        .map(|(name, file)| {
            let file = file
                .as_str()
                .filter(|f| is_plain_file_name(f))
                .ok_or_else(|| {
                    ModelError::format(
                        index_path,
                        format!("weight_map.{name}: expected a shard file name, got {file}"),
                    )
                })?;
            Ok((name.clone(), file.to_string()))
        })
        .collect()
}

/// A shard must sit next to its index: no directories, no `..`, no absolute paths.
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    )
}
