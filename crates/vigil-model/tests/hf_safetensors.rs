//! Safetensors loading of the committed tiny checkpoints, checked against the per-tensor values
//! the Python `safetensors` library read back when the fixtures were made (`ref.json`), and
//! broken files that must give an error naming the file.

use serde_json::Value;
use std::path::{Path, PathBuf};
use vigil_kernels::{DType, WeightData};
use vigil_model::hf::SafetensorsStore;
use vigil_model::ModelError;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vigil-hf-st-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every tensor of `ref.json` is in the store with the recorded dtype, shape, file and values.
fn check_against_ref(name: &str) -> SafetensorsStore {
    let dir = fixture(name);
    let store = SafetensorsStore::open(&dir).unwrap();
    let reference = read_json(&dir.join("ref.json"));
    let tensors = reference["tensors"].as_object().unwrap();
    let mut names: Vec<&str> = store.names().collect();
    names.sort_unstable();
    let mut want: Vec<&str> = tensors.keys().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(names, want, "{name}: tensor names");

    for (tname, r) in tensors {
        let t = store.tensor(tname).unwrap();
        let dtype = match r["dtype"].as_str().unwrap() {
            "float32" => DType::F32,
            "bfloat16" => DType::BF16,
            "float16" => DType::F16,
            other => panic!("{other}"),
        };
        assert_eq!(t.dtype, dtype, "{tname}");
        let shape: Vec<usize> = r["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.shape, shape, "{tname}");
        assert_eq!(t.file.file_name().unwrap(), r["file"].as_str().unwrap());
        assert!(
            matches!(t.data, WeightData::Mapped { .. }),
            "{tname} is copied"
        );

        let values = t.to_f32_vec();
        assert_eq!(values.len(), t.numel());
        // Recorded values are f32s; serde_json may parse them 1 f64-ulp off, so compare as f32.
        let as_f32 = |v: &Value| v.as_f64().unwrap() as f32;
        for (i, v) in r["first"].as_array().unwrap().iter().enumerate() {
            assert_eq!(values[i], as_f32(v), "{tname}[{i}]");
        }
        assert_eq!(*values.last().unwrap(), as_f32(&r["last"]), "{tname} last");
        let sum: f64 = values.iter().map(|&v| v as f64).sum();
        let want_sum = r["sum"].as_f64().unwrap();
        assert!(
            (sum - want_sum).abs() <= 1e-9 * (1.0 + want_sum.abs()),
            "{tname}: sum {sum} vs {want_sum}"
        );
    }
    store
}

#[test]
fn single_file_checkpoints_match_python() {
    for name in ["qwen3", "qwen3_moe", "gemma3"] {
        let store = check_against_ref(name);
        assert_eq!(store.files().count(), 1);
    }
}

#[test]
fn sharded_checkpoint_matches_python_and_its_index() {
    let dir = fixture("llama");
    let store = check_against_ref("llama");
    assert_eq!(store.files().count(), 2);
    let index = read_json(&dir.join("model.safetensors.index.json"));
    for (name, file) in index["weight_map"].as_object().unwrap() {
        let t = store.tensor(name).unwrap();
        assert_eq!(t.file, dir.join(file.as_str().unwrap()));
    }
    // Tied embeddings: HF writes no lm_head.
    assert!(!store.contains("lm_head.weight"));
}

#[test]
fn bf16_checkpoints_are_the_f32_weights_rounded() {
    for (f32_name, bf16_name) in [("llama", "llama_bf16"), ("qwen3", "qwen3_bf16")] {
        let wide = SafetensorsStore::open(&fixture(f32_name)).unwrap();
        let narrow = check_against_ref(bf16_name);
        for name in narrow.names() {
            let a = wide.tensor(name).unwrap().to_f32_vec();
            let b = narrow.tensor(name).unwrap().to_f32_vec();
            let rounded: Vec<f32> = a
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_f32())
                .collect();
            assert_eq!(rounded, b, "{bf16_name} {name}");
        }
    }
}

#[test]
fn matrices_are_views_with_pytorch_row_order() {
    let store = SafetensorsStore::open(&fixture("qwen3")).unwrap();
    let t = store
        .tensor("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let m = t.to_matrix().unwrap();
    assert_eq!((m.dtype, m.rows, m.cols), (DType::F32, 128, 64));
    let values = t.to_f32_vec();
    let row1: Vec<f32> = m
        .row(1)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(row1, values[64..128]);

    let bf = SafetensorsStore::open(&fixture("qwen3_bf16")).unwrap();
    let m = bf
        .tensor("model.layers.1.mlp.down_proj.weight")
        .unwrap()
        .to_matrix()
        .unwrap();
    assert_eq!(
        (m.dtype, m.rows, m.cols, m.row_bytes()),
        (DType::BF16, 64, 96, 192)
    );

    let err = store
        .tensor("model.norm.weight")
        .unwrap()
        .to_matrix()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.norm.weight") && err.contains("model.safetensors"),
        "{err}"
    );
}

fn copy_fixture(name: &str, to: &str) -> PathBuf {
    let dir = temp_dir(to);
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    dir
}

/// `open` fails with a format error whose message names `file` and each of `words`.
fn expect_format_error(dir: &Path, file: &str, words: &[&str]) {
    match SafetensorsStore::open(dir) {
        Err(e @ ModelError::Format { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(file), "{msg} lacks {file}");
            for w in words {
                assert!(msg.contains(w), "{msg} lacks {w}");
            }
        }
        Err(e) => panic!("expected a format error, got {e}"),
        Ok(_) => panic!("expected a format error, got a store"),
    }
}

#[test]
fn truncated_file_is_an_error_naming_it() {
    let dir = copy_fixture("qwen3", "truncated");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    expect_format_error(&dir, "model.safetensors", &["truncated"]);
    // Cut inside the header, and down to nothing.
    std::fs::write(&path, &bytes[..100]).unwrap();
    expect_format_error(&dir, "model.safetensors", &[]);
    std::fs::write(&path, b"").unwrap();
    expect_format_error(&dir, "model.safetensors", &[]);
}

#[test]
fn corrupted_header_is_an_error_naming_the_file() {
    let dir = copy_fixture("qwen3_bf16", "header");
    let path = dir.join("model.safetensors");
    let good = std::fs::read(&path).unwrap();

    let mut bad = good.clone();
    bad[8] = b'['; // the header JSON no longer parses as an object
    std::fs::write(&path, &bad).unwrap();
    expect_format_error(&dir, "model.safetensors", &[]);

    let mut bad = good.clone();
    bad[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &bad).unwrap();
    expect_format_error(&dir, "model.safetensors", &[]);

    // A tensor's data range pointing past the end of the file.
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len]).unwrap();
    let mut json: Value = serde_json::from_str(header).unwrap();
    let (name, info) = json
        .as_object_mut()
        .unwrap()
        .iter_mut()
        .find(|(k, _)| *k != "__metadata__")
        .unwrap();
    let _ = name;
    info["data_offsets"][1] = Value::from(10_000_000u64);
    let new_header = serde_json::to_vec(&json).unwrap();
    let mut bad = (new_header.len() as u64).to_le_bytes().to_vec();
    bad.extend_from_slice(&new_header);
    bad.extend_from_slice(&good[8 + header_len..]);
    std::fs::write(&path, &bad).unwrap();
    expect_format_error(&dir, "model.safetensors", &[]);
}

#[test]
fn index_pointing_to_a_missing_shard_names_both() {
    let dir = copy_fixture("llama", "missing_shard");
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    expect_format_error(
        &dir,
        "model.safetensors.index.json",
        &["model-00002-of-00002.safetensors"],
    );

    let dir = copy_fixture("llama", "escaping_shard");
    let index_path = dir.join("model.safetensors.index.json");
    let mut index = read_json(&index_path);
    index["weight_map"]["model.norm.weight"] = Value::from("../model-00002-of-00002.safetensors");
    std::fs::write(&index_path, index.to_string()).unwrap();
    expect_format_error(&dir, "model.safetensors.index.json", &["model.norm.weight"]);

    let dir = copy_fixture("llama", "wrong_shard");
    let index_path = dir.join("model.safetensors.index.json");
    let mut index = read_json(&index_path);
    index["weight_map"]["model.norm.weight"] = Value::from("model-00001-of-00002.safetensors");
    std::fs::write(&index_path, index.to_string()).unwrap();
    expect_format_error(&dir, "model.safetensors.index.json", &["model.norm.weight"]);

    expect_format_error(&temp_dir("empty"), "vigil-hf-st", &["model.safetensors"]);
}

#[test]
fn unsupported_dtype_and_absent_tensor_name_the_tensor() {
    let dir = temp_dir("dtype");
    let ids: Vec<u8> = [1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let ok: Vec<u8> = [0.5f32, -1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let views = [
        (
            "position_ids",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![3], &ids).unwrap(),
        ),
        (
            "w",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &ok).unwrap(),
        ),
    ];
    let bytes = safetensors::tensor::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();

    let store = SafetensorsStore::open(&dir).unwrap();
    assert_eq!(store.tensor("w").unwrap().to_f32_vec(), [0.5, -1.0]);
    match store.tensor("position_ids") {
        Err(e @ ModelError::Unsupported { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("position_ids")
                    && msg.contains("model.safetensors")
                    && msg.contains("I64"),
                "{msg}"
            );
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
    let err = store.tensor("nope").unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
}

/// What `load` serves weights from (unless VIGIL_MMAP=1): the checkpoint's bytes, copied from
/// both shards into one buffer of their own, a tied output's once with its embedding.
#[test]
fn loaded_weights_are_a_resident_copy_of_the_checkpoint() {
    let dir = fixture("llama");
    let opts = vigil_model::load::LoadOptions {
        threads: Some(1),
        ..Default::default()
    };
    let weights = vigil_model::load::load(&dir, &opts).unwrap().model.weights;
    let store = SafetensorsStore::open(&dir).unwrap();
    let map_of = |data: &WeightData| match data {
        WeightData::Mapped { map, .. } => map.clone(),
        WeightData::Owned(_) => panic!("owned, not a view of the resident copy"),
    };
    let copy = map_of(&weights.token_embd.data);
    let last = weights.layers.len() - 1;
    for (name, m) in [
        ("model.embed_tokens.weight", &weights.token_embd),
        (
            "model.layers.0.self_attn.q_proj.weight",
            &weights.layers[0].wq,
        ),
        (
            &*format!("model.layers.{last}.self_attn.o_proj.weight"),
            &weights.layers[last].wo,
        ),
    ] {
        let file = store.tensor(name).unwrap();
        // The kernels' matrices are interleaved 8 rows at a time (`quant::interleave`): the
        // same rows, byte for byte, in another order.
        let n = m.row_bytes();
        for r in 0..m.rows {
            assert_eq!(
                vigil_kernels::quant::interleave::row_bytes(m, r),
                file.data.bytes()[r * n..(r + 1) * n],
                "{name} row {r} of the resident copy ({:?})",
                m.layout
            );
        }
        assert!(
            std::sync::Arc::ptr_eq(&map_of(&m.data), &copy),
            "{name} ({}) is not in the one resident buffer",
            file.file.display()
        );
    }
    let shards: std::collections::BTreeSet<_> = store
        .names()
        .map(|n| store.tensor(n).unwrap().file)
        .collect();
    assert_eq!(shards.len(), 2, "the fixture spans two shards");
    assert_eq!(
        weights.output.data.bytes().as_ptr(),
        weights.token_embd.data.bytes().as_ptr(),
        "the tied output is copied once with its embedding"
    );
}
