//! The reader parses a small GGUF written by the Python `gguf` package's `GGUFWriter` into
//! exactly the values, tensor infos and tensor bytes the writer was given (`small.json`,
//! from `scripts/make_gguf_fixtures.py`).

use serde_json::Value;
use std::path::PathBuf;
use vigil_kernels::quant::dequant::dequantize_row;
use vigil_kernels::DType;
use vigil_model::gguf::{GgufFile, GgufValue};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf")
}

fn open_small() -> (GgufFile, Value) {
    let dir = fixture_dir();
    let file = GgufFile::open(&dir.join("small.gguf")).unwrap();
    let json = std::fs::read_to_string(dir.join("small.json")).unwrap();
    (file, serde_json::from_str(&json).unwrap())
}

/// The `GgufValue` a `{"type": .., "value"/"bits": ..}` JSON description stands for.
fn to_value(v: &Value) -> GgufValue {
    let ty = v["type"].as_str().unwrap();
    let x = &v["value"];
    let int = || x.as_i64().unwrap();
    match ty {
        "U8" => GgufValue::U8(int() as u8),
        "I8" => GgufValue::I8(int() as i8),
        "U16" => GgufValue::U16(int() as u16),
        "I16" => GgufValue::I16(int() as i16),
        "U32" => GgufValue::U32(int() as u32),
        "I32" => GgufValue::I32(int() as i32),
        "U64" => GgufValue::U64(x.as_u64().unwrap()),
        "I64" => GgufValue::I64(int()),
        "F32" => GgufValue::F32(f32::from_bits(v["bits"].as_u64().unwrap() as u32)),
        "F64" => GgufValue::F64(f64::from_bits(v["bits"].as_u64().unwrap())),
        "Bool" => GgufValue::Bool(x.as_bool().unwrap()),
        "String" => GgufValue::String(x.as_str().unwrap().to_owned()),
        "Array" => GgufValue::Array(x.as_array().unwrap().iter().map(to_value).collect()),
        other => panic!("unknown type {other}"),
    }
}

/// Floats compare by bit pattern (-0.0 must stay -0.0).
fn same(a: &GgufValue, b: &GgufValue) -> bool {
    match (a, b) {
        (GgufValue::F32(x), GgufValue::F32(y)) => x.to_bits() == y.to_bits(),
        (GgufValue::F64(x), GgufValue::F64(y)) => x.to_bits() == y.to_bits(),
        (GgufValue::Array(x), GgufValue::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        _ => a == b,
    }
}

fn dtype_named(name: &str) -> DType {
    [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ]
    .into_iter()
    .find(|d| d.name() == name)
    .unwrap_or_else(|| panic!("no dtype {name}"))
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f32_bits(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn header_matches_the_writer() {
    let (f, exp) = open_small();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment(), exp["alignment"].as_u64().unwrap());
    assert_eq!(
        f.alignment(),
        64,
        "fixture must use a non-default alignment"
    );
    assert_eq!(f.data_offset(), exp["data_offset"].as_u64().unwrap());
    assert_eq!(f.architecture(), Some("testarch"));
}

#[test]
fn every_metadata_value_matches_the_writer() {
    let (f, exp) = open_small();
    let expected = exp["metadata"].as_object().unwrap();
    assert_eq!(f.metadata.len(), expected.len(), "metadata key count");
    for (key, v) in expected {
        let want = to_value(v);
        let got = f.get(key).unwrap_or_else(|| panic!("missing key {key}"));
        assert!(same(got, &want), "{key}: got {got:?}, want {want:?}");
    }
}

#[test]
fn typed_accessors() {
    let (f, _) = open_small();
    assert_eq!(f.get_u32("test.u8"), Some(200));
    assert_eq!(f.get_u32("test.u16"), Some(60000));
    assert_eq!(f.get_u32("test.u32"), Some(4_000_000_000));
    assert_eq!(f.get_u32("test.i8"), None, "negative does not fit u32");
    assert_eq!(f.get_u32("test.u64"), None, "too large for u32");
    assert_eq!(f.get_u64("test.u64"), Some(18_000_000_000_000_000_000));
    assert_eq!(f.get_u32("test.string"), None);
    assert_eq!(f.get_f32("test.f32"), Some(1.5625e-3));
    assert_eq!(f.get_bool("test.bool_true"), Some(true));
    assert_eq!(f.get_bool("test.bool_false"), Some(false));
    assert_eq!(f.get_str("test.string"), Some("héllo 世界 🦙"));
    assert_eq!(f.get_str("test.empty_string"), Some(""));
    assert_eq!(
        f.get_str_array("test.arr_str"),
        Some(vec!["a", "", "<|im_start|>", "Ġthe", "ü"])
    );
    assert_eq!(f.get_str_array("test.arr_u8"), None);
    assert_eq!(f.get_i32_array("test.arr_i8"), Some(vec![-128, 0, 127]));
    assert_eq!(
        f.get_i32_array("test.arr_u32"),
        None,
        "4294967295 does not fit i32"
    );
    assert_eq!(f.get_u32_array("test.arr_u32"), Some(vec![1, 2, u32::MAX]));
    assert_eq!(
        f.get_f32_array("test.arr_f32"),
        Some(vec![0.5, -1.25, 1e-8])
    );
    assert_eq!(f.get("missing.key"), None);
    let nested = f.get("test.nested_i32").unwrap().as_array().unwrap();
    assert_eq!(nested.len(), 3);
    assert_eq!(
        nested[1],
        GgufValue::Array(vec![
            GgufValue::I32(3),
            GgufValue::I32(4),
            GgufValue::I32(5)
        ])
    );
}

#[test]
fn tensor_infos_and_bytes_match_the_writer() {
    let (f, exp) = open_small();
    let tensors = exp["tensors"].as_array().unwrap();
    assert_eq!(f.tensors.len(), tensors.len());
    for (info, t) in f.tensors.iter().zip(tensors) {
        let name = t["name"].as_str().unwrap();
        assert_eq!(info.name, name);
        assert_eq!(f.tensor(name), Some(info));
        let dims: Vec<u64> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(info.dims, dims, "{name} dims");
        assert_eq!(
            info.dtype,
            dtype_named(t["type"].as_str().unwrap()),
            "{name}"
        );
        assert_eq!(info.offset, t["offset"].as_u64().unwrap(), "{name} offset");
        let bytes = hex_bytes(t["hex"].as_str().unwrap());
        assert_eq!(f.tensor_data(info).bytes(), &bytes[..], "{name} bytes");
        assert_eq!(info.n_bytes(), bytes.len() as u64);

        let values = bits(&f.tensor_f32(name).unwrap());
        assert_eq!(values, f32_bits(&t["f32_bits"]), "{name} dequantized");
    }
    assert!(f.tensor("nope").is_none());
}

#[test]
fn matrices_view_rows_of_the_tensor() {
    let (f, exp) = open_small();
    for t in exp["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let dims = t["dims"].as_array().unwrap();
        let expected = f32_bits(&t["f32_bits"]);
        if dims.len() == 3 {
            let err = f.tensor_matrix(name).unwrap_err().to_string();
            assert!(err.contains("small.gguf") && err.contains(name), "{err}");
            let ms = f.tensor_matrices(name).unwrap();
            assert_eq!(ms.len(), dims[2].as_u64().unwrap() as usize);
            let per_expert = expected.len() / ms.len();
            for (e, m) in ms.iter().enumerate() {
                assert_eq!((m.rows, m.cols), (2, 64));
                let mut row = vec![0.0; m.cols];
                for r in 0..m.rows {
                    dequantize_row(m, r, &mut row);
                    let start = e * per_expert + r * m.cols;
                    assert_eq!(
                        bits(&row),
                        expected[start..start + m.cols],
                        "{name} expert {e} row {r}"
                    );
                }
            }
            continue;
        }
        let m = f.tensor_matrix(name).unwrap();
        assert_eq!(m.cols as u64, dims[0].as_u64().unwrap());
        let rows = dims.get(1).map_or(1, |d| d.as_u64().unwrap()) as usize;
        assert_eq!(m.rows, rows);
        let mut row = vec![0.0; m.cols];
        for r in 0..m.rows {
            dequantize_row(&m, r, &mut row);
            assert_eq!(
                bits(&row),
                expected[r * m.cols..(r + 1) * m.cols],
                "{name} row {r}"
            );
        }
    }
    let err = f.tensor_matrix("missing.weight").unwrap_err().to_string();
    assert!(
        err.contains("missing.weight") && err.contains("small.gguf"),
        "{err}"
    );
}
