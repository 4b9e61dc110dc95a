//! The reader on the real SmolLM2-135M-Instruct Q4_1 GGUF (`$VIGIL_TEST_GGUF`): header values
//! and tensor infos equal what the Python `gguf` reader reads, the first blocks of tensors of
//! every type present dequantize bit-for-bit like `gguf.quants.dequantize`, and truncated
//! prefixes of the header are errors. Expected values: `smollm2.json` and
//! `smollm2_*.out.bin` from `scripts/make_gguf_fixtures.py`.

use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use vigil_kernels::quant::dequant::dequantize;
use vigil_model::gguf::{GgufFile, GgufHeader};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf")
}

fn real_gguf() -> Option<PathBuf> {
    match std::env::var_os("VIGIL_TEST_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("VIGIL_TEST_GGUF is not set: skipping the real-GGUF test");
            None
        }
    }
}

fn expected() -> Value {
    let json = std::fs::read_to_string(fixture_dir().join("smollm2.json")).unwrap();
    serde_json::from_str(&json).unwrap()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

#[test]
fn header_matches_the_python_reader() {
    let Some(path) = real_gguf() else { return };
    let exp = expected();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version as u64, u64_of(&exp["version"]));
    assert_eq!(f.tensors.len() as u64, u64_of(&exp["tensor_count"]));
    assert_eq!(f.metadata.len() as u64, u64_of(&exp["kv_count"]));
    assert_eq!(f.alignment(), u64_of(&exp["alignment"]));
    assert_eq!(f.data_offset(), u64_of(&exp["data_offset"]));
    assert_eq!(f.architecture(), exp["architecture"].as_str());
    assert_eq!(f.get_str("general.name"), exp["name"].as_str());
    let u32_key = |k: &str| f.get_u32(k).map(u64::from);
    assert_eq!(u32_key("llama.block_count"), exp["block_count"].as_u64());
    assert_eq!(
        u32_key("llama.context_length"),
        exp["context_length"].as_u64()
    );
    assert_eq!(
        u32_key("llama.embedding_length"),
        exp["embedding_length"].as_u64()
    );
    assert_eq!(
        u32_key("llama.attention.head_count"),
        exp["head_count"].as_u64()
    );
    assert_eq!(
        u32_key("llama.attention.head_count_kv"),
        exp["head_count_kv"].as_u64()
    );
    assert_eq!(
        u32_key("tokenizer.ggml.bos_token_id"),
        exp["bos_token_id"].as_u64()
    );
    let f32_bits = |k: &str| f.get_f32(k).map(|v| v.to_bits() as u64);
    assert_eq!(
        f32_bits("llama.rope.freq_base"),
        exp["rope_freq_base_bits"].as_u64()
    );
    assert_eq!(
        f32_bits("llama.attention.layer_norm_rms_epsilon"),
        exp["rms_eps_bits"].as_u64()
    );
    assert_eq!(
        f.get_bool("tokenizer.ggml.add_bos_token"),
        exp["add_bos_token"].as_bool()
    );

    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, u64_of(&exp["token_count"]));
    let first: Vec<&str> = exp["first_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens[..first.len()], first[..]);
    assert_eq!(tokens.last().copied(), exp["last_token"].as_str());
    let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len() as u64, u64_of(&exp["merge_count"]));
    assert_eq!(merges[0], exp["first_merges"][0].as_str().unwrap());
    let types = f.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), tokens.len());
    assert_eq!(types[0] as u64, u64_of(&exp["token_type_first"][0]));
    assert_eq!(
        f.get_str("tokenizer.chat_template").map(|s| s.len() as u64),
        exp["chat_template_len"].as_u64()
    );

    for t in exp["tensor_infos"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = f.tensor(name).unwrap();
        let dims: Vec<u64> = t["dims"].as_array().unwrap().iter().map(u64_of).collect();
        assert_eq!(info.dims, dims, "{name}");
        assert_eq!(info.dtype.name(), t["type"].as_str().unwrap(), "{name}");
        assert_eq!(info.offset, u64_of(&t["offset"]), "{name}");
    }
    let embd = f.tensor_matrix("token_embd.weight").unwrap();
    assert_eq!((embd.rows, embd.cols), (tokens.len(), 576));
}

#[test]
fn real_blocks_dequantize_like_the_reference() {
    let Some(path) = real_gguf() else { return };
    let exp = expected();
    let f = GgufFile::open(&path).unwrap();
    for d in exp["dequant"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap();
        let info = f.tensor(name).unwrap();
        assert_eq!(info.dtype.name(), d["type"].as_str().unwrap());
        let n_bytes = u64_of(&d["blocks"]) as usize * info.dtype.type_size();
        let data = f.tensor_data(info);
        let reference: Vec<u32> =
            std::fs::read(fixture_dir().join(d["expected"].as_str().unwrap()))
                .unwrap()
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
        let mut out = vec![f32::NAN; reference.len()];
        dequantize(info.dtype, &data.bytes()[..n_bytes], &mut out).unwrap();
        for (i, (g, e)) in out.iter().zip(&reference).enumerate() {
            assert_eq!(
                g.to_bits(),
                *e,
                "{name} value {i}: {g} vs {}",
                f32::from_bits(*e)
            );
        }
    }
}

/// The first `n` bytes of the file.
fn prefix(path: &Path, n: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .take(n)
        .read_to_end(&mut buf)
        .unwrap();
    buf
}

#[test]
fn truncated_headers_are_errors() {
    let Some(path) = real_gguf() else { return };
    let data_offset = u64_of(&expected()["data_offset"]);
    let header = prefix(&path, data_offset);
    let n = header.len();
    // Every offset in the fixed header and the first entries, then ~300 spread over the rest
    // (inside the token and merge arrays, the tensor infos and the padding).
    let offsets = (0..512).chain((512..n).step_by(n / 300)).chain(n - 64..n);
    for len in offsets {
        let err = GgufHeader::parse(&header[..len], &path)
            .expect_err("a truncated file must not parse")
            .to_string();
        assert!(err.contains(path.to_str().unwrap()), "{err}");
    }
}
