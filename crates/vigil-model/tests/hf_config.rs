//! `config.json` / `generation_config.json` of HF checkpoints: the committed tiny checkpoints
//! (made by transformers, see tests/fixtures/tiny/README.md) and hand-broken variants.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use vigil_model::config::{Activation, Llama3RopeScaling, LocalAttention, MoeConfig, RopeStyle};
use vigil_model::hf::{load_generation_config, load_hf_config, GenerationConfig, SafetensorsStore};
use vigil_model::{Arch, ModelConfig, ModelError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

/// A fresh empty directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vigil-hf-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Load `config` written as `config.json` into a temp dir named `name`.
fn load_json_config(name: &str, config: &Value) -> Result<ModelConfig, ModelError> {
    let dir = temp_dir(name);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    load_hf_config(&dir)
}

fn llama_expected() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 384,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Neox,
        rope_scaling: Some(Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        }),
        max_position_embeddings: 128,
        tie_word_embeddings: true,
        qk_norm: false,
        moe: None,
        local_attention: None,
        scale_embeddings: false,
        post_norms: false,
        activation: Default::default(),
        query_pre_attn_scalar: None,
    }
}

fn qwen3_expected() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: 384,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_style: RopeStyle::Neox,
        rope_scaling: None,
        max_position_embeddings: 128,
        tie_word_embeddings: false,
        qk_norm: true,
        moe: None,
        local_attention: None,
        scale_embeddings: false,
        post_norms: false,
        activation: Default::default(),
        query_pre_attn_scalar: None,
    }
}

#[test]
fn llama_fixture_hub_style_and_v5_style_configs() {
    assert_eq!(load_hf_config(&fixture("llama")).unwrap(), llama_expected());
    // llama_bf16 carries the same model in transformers-5 keys (`rope_parameters`).
    assert_eq!(
        load_hf_config(&fixture("llama_bf16")).unwrap(),
        llama_expected()
    );
}

#[test]
fn qwen3_fixture_configs() {
    assert_eq!(load_hf_config(&fixture("qwen3")).unwrap(), qwen3_expected());
    assert_eq!(
        load_hf_config(&fixture("qwen3_bf16")).unwrap(),
        qwen3_expected()
    );
}

#[test]
fn qwen3_moe_fixture_config() {
    let cfg = load_hf_config(&fixture("qwen3_moe")).unwrap();
    let expected = ModelConfig {
        arch: Arch::Qwen3Moe,
        head_dim: 16,
        moe: Some(MoeConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![0],
        }),
        ..qwen3_expected()
    };
    assert_eq!(cfg, expected);
    assert!(!cfg.is_sparse_layer(0));
    assert!(cfg.is_sparse_layer(1));
}

fn gemma3_expected() -> ModelConfig {
    ModelConfig {
        arch: Arch::Gemma3,
        vocab_size: 384,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_style: RopeStyle::Neox,
        rope_scaling: None,
        max_position_embeddings: 128,
        tie_word_embeddings: true,
        qk_norm: true,
        moe: None,
        // layer_types: three sliding layers, then a full one.
        local_attention: Some(LocalAttention {
            window: 8,
            pattern: 4,
            rope_theta: 10_000.0,
        }),
        scale_embeddings: true,
        post_norms: true,
        activation: Activation::GeluTanh,
        query_pre_attn_scalar: Some(24.0),
    }
}

#[test]
fn gemma3_fixture_config() {
    let cfg = load_hf_config(&fixture("gemma3")).unwrap();
    assert_eq!(cfg, gemma3_expected());
    let windows: Vec<_> = (0..4).map(|i| cfg.layer_window(i)).collect();
    assert_eq!(windows, [Some(8), Some(8), Some(8), None]);
    assert_eq!(cfg.attn_scale(), 1.0 / 24f32.sqrt());
}

/// The same Gemma 3 config in the other key styles: transformers 5 (`rope_parameters` per
/// layer type, as `save_pretrained` writes it) and early Hub configs (`sliding_window_pattern`
/// without `layer_types`).
#[test]
fn gemma3_v5_and_pattern_keys() {
    let hub = read_json(&fixture("gemma3/config.json"));

    let mut v5 = hub.clone();
    let obj = v5.as_object_mut().unwrap();
    for key in [
        "rope_theta",
        "rope_local_base_freq",
        "rope_scaling",
        "torch_dtype",
    ] {
        obj.remove(key);
    }
    obj.insert("dtype".into(), json!("float32"));
    obj.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
        }),
    );
    // transformers 5 writes its default pattern beside the layer types; layer_types wins.
    obj.insert("_sliding_window_pattern".into(), json!(6));
    assert_eq!(
        load_json_config("gemma3_v5", &v5).unwrap(),
        gemma3_expected()
    );

    let mut old = hub.clone();
    let obj = old.as_object_mut().unwrap();
    obj.remove("layer_types");
    obj.remove("_sliding_window_pattern");
    obj.insert("sliding_window_pattern".into(), json!(4));
    assert_eq!(
        load_json_config("gemma3_pattern", &old).unwrap(),
        gemma3_expected()
    );

    // Pattern 2 over 4 layers: layers 1 and 3 global.
    old["sliding_window_pattern"] = json!(2);
    let cfg = load_json_config("gemma3_pattern2", &old).unwrap();
    let windows: Vec<_> = (0..4).map(|i| cfg.layer_window(i)).collect();
    assert_eq!(windows, [Some(8), None, Some(8), None]);

    // No sliding layer: plain global attention with one RoPE base.
    let mut global = hub.clone();
    global["layer_types"] = json!(vec!["full_attention"; 4]);
    let cfg = load_json_config("gemma3_global", &global).unwrap();
    assert_eq!(cfg.local_attention, None);
    assert_eq!(cfg.rope_theta, 1_000_000.0);

    // Gemma3TextConfig's defaults.
    let mut defaults = hub.clone();
    let obj = defaults.as_object_mut().unwrap();
    for key in [
        "head_dim",
        "query_pre_attn_scalar",
        "rope_theta",
        "rope_local_base_freq",
        "tie_word_embeddings",
        "sliding_window",
    ] {
        obj.remove(key);
    }
    let cfg = load_json_config("gemma3_defaults", &defaults).unwrap();
    assert_eq!(cfg.head_dim, 256);
    assert_eq!(cfg.query_pre_attn_scalar, Some(256.0));
    assert_eq!(cfg.rope_theta, 1_000_000.0);
    assert_eq!(cfg.local_attention.unwrap().rope_theta, 10_000.0);
    assert_eq!(cfg.local_attention.unwrap().window, 4096);
    assert!(cfg.tie_word_embeddings);
}

/// What this decoder does not compute is refused by name, never ignored.
#[test]
fn gemma3_unsupported_options_are_refused() {
    let hub = read_json(&fixture("gemma3/config.json"));
    let with = |key: &str, v: Value| {
        let mut c = hub.clone();
        c[key] = v;
        c
    };
    expect_unsupported(
        load_json_config("g_final_cap", &with("final_logit_softcapping", json!(30.0))),
        &["final_logit_softcapping", "30"],
    );
    expect_unsupported(
        load_json_config("g_attn_cap", &with("attn_logit_softcapping", json!(50.0))),
        &["attn_logit_softcapping", "50"],
    );
    expect_unsupported(
        load_json_config("g_act", &with("hidden_activation", json!("gelu"))),
        &["hidden_activation", "gelu"],
    );
    expect_unsupported(
        load_json_config("g_bidi", &with("use_bidirectional_attention", json!(true))),
        &["use_bidirectional_attention"],
    );
    expect_unsupported(
        load_json_config(
            "g_linear",
            &with(
                "rope_scaling",
                json!({"rope_type": "linear", "factor": 8.0}),
            ),
        ),
        &["rope_scaling", "linear"],
    );
    expect_unsupported(
        load_json_config(
            "g_layers",
            &with(
                "layer_types",
                json!([
                    "full_attention",
                    "sliding_attention",
                    "sliding_attention",
                    "full_attention"
                ]),
            ),
        ),
        &["layer_types", "[0, 3]"],
    );
    // The multimodal Gemma 3 config (text under `text_config`) is not the text-only one.
    expect_unsupported(
        load_json_config("g_mm", &with("model_type", json!("gemma3"))),
        &["model_type", "gemma3_text"],
    );
    expect_format(
        load_json_config(
            "g_types_len",
            &with("layer_types", json!(["full_attention"])),
        ),
        &["layer_types", "1 entries for 4 layers"],
    );
}

/// The parsed dimensions are the ones the weights were saved with.
#[test]
fn fixture_configs_agree_with_tensor_shapes() {
    for name in [
        "llama",
        "qwen3",
        "qwen3_moe",
        "llama_bf16",
        "qwen3_bf16",
        "gemma3",
    ] {
        let dir = fixture(name);
        let cfg = load_hf_config(&dir).unwrap();
        let store = SafetensorsStore::open(&dir).unwrap();
        let shape = |t: &str| store.tensor(t).unwrap().shape;
        assert_eq!(
            shape("model.embed_tokens.weight"),
            [cfg.vocab_size, cfg.hidden_size]
        );
        assert_eq!(
            store.contains("lm_head.weight"),
            !cfg.tie_word_embeddings,
            "{name}"
        );
        for layer in 0..cfg.num_layers {
            let p = format!("model.layers.{layer}");
            assert_eq!(
                shape(&format!("{p}.self_attn.q_proj.weight")),
                [cfg.q_dim(), cfg.hidden_size]
            );
            assert_eq!(
                shape(&format!("{p}.self_attn.k_proj.weight")),
                [cfg.kv_dim(), cfg.hidden_size]
            );
            assert_eq!(
                shape(&format!("{p}.self_attn.o_proj.weight")),
                [cfg.hidden_size, cfg.q_dim()]
            );
            assert_eq!(
                store.contains(&format!("{p}.self_attn.q_norm.weight")),
                cfg.qk_norm
            );
            assert_eq!(
                store.contains(&format!("{p}.post_feedforward_layernorm.weight")),
                cfg.post_norms,
                "{name}"
            );
            match (&cfg.moe, cfg.is_sparse_layer(layer)) {
                (Some(moe), true) => {
                    assert_eq!(
                        shape(&format!("{p}.mlp.gate.weight")),
                        [moe.num_experts, cfg.hidden_size]
                    );
                    let last = moe.num_experts - 1;
                    assert_eq!(
                        shape(&format!("{p}.mlp.experts.{last}.down_proj.weight")),
                        [cfg.hidden_size, moe.moe_intermediate_size]
                    );
                }
                _ => assert_eq!(
                    shape(&format!("{p}.mlp.gate_proj.weight")),
                    [cfg.intermediate_size, cfg.hidden_size]
                ),
            }
        }
    }
}

/// The ids of generation_config.json are those of the special tokens in tokenizer.json.
#[test]
fn generation_configs_match_the_tokenizer() {
    let tok = read_json(&fixture("tokenizer/tokenizer.json"));
    let id_of = |content: &str| {
        tok["added_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["content"] == content)
            .unwrap()["id"]
            .as_u64()
            .unwrap() as u32
    };
    let qwen = load_generation_config(&fixture("qwen3")).unwrap().unwrap();
    assert_eq!(
        qwen,
        GenerationConfig {
            bos_token_id: Some(id_of("<|endoftext|>")),
            eos_token_ids: vec![id_of("<|im_end|>"), id_of("<|endoftext|>")],
            do_sample: Some(true),
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            repetition_penalty: None,
        }
    );
    let llama = load_generation_config(&fixture("llama")).unwrap().unwrap();
    assert_eq!(llama.top_k, None);
    assert_eq!(llama.top_p, Some(0.9));
    assert_eq!(llama.eos_token_ids, qwen.eos_token_ids);
}

#[test]
fn generation_config_single_eos_nulls_and_absence() {
    let dir = temp_dir("gen");
    assert_eq!(load_generation_config(&dir).unwrap(), None);
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": null, "eos_token_id": 7, "temperature": null, "repetition_penalty": 1.1}"#,
    )
    .unwrap();
    let g = load_generation_config(&dir).unwrap().unwrap();
    assert_eq!(g.bos_token_id, None);
    assert_eq!(g.eos_token_ids, vec![7]);
    assert_eq!(g.temperature, None);
    assert_eq!(g.repetition_penalty, Some(1.1));

    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, "x"]}"#,
    )
    .unwrap();
    let err = load_generation_config(&dir).unwrap_err().to_string();
    assert!(
        err.contains("generation_config.json") && err.contains("eos_token_id"),
        "{err}"
    );
}

fn base_config() -> Value {
    read_json(&fixture("llama/config.json"))
}

fn expect_format(result: Result<ModelConfig, ModelError>, words: &[&str]) {
    match result {
        Err(e @ ModelError::Format { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("config.json"), "{msg}");
            for w in words {
                assert!(msg.contains(w), "{msg} lacks {w}");
            }
        }
        other => panic!("expected a format error, got {other:?}"),
    }
}

fn expect_unsupported(result: Result<ModelConfig, ModelError>, words: &[&str]) {
    match result {
        Err(e @ ModelError::Unsupported { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("config.json"), "{msg}");
            for w in words {
                assert!(msg.contains(w), "{msg} lacks {w}");
            }
        }
        other => panic!("expected an unsupported error, got {other:?}"),
    }
}

#[test]
fn wrong_types_and_missing_fields_name_the_field() {
    let mut c = base_config();
    c["hidden_size"] = json!("64");
    expect_format(load_json_config("type", &c), &["hidden_size"]);

    let mut c = base_config();
    c.as_object_mut().unwrap().remove("num_hidden_layers");
    expect_format(
        load_json_config("missing", &c),
        &["num_hidden_layers", "missing"],
    );

    let mut c = base_config();
    c["rms_norm_eps"] = json!([1e-5]);
    expect_format(load_json_config("eps", &c), &["rms_norm_eps"]);

    let mut c = base_config();
    c["num_key_value_heads"] = json!(3);
    expect_format(load_json_config("kv", &c), &["num_key_value_heads"]);

    let mut c = base_config();
    c["rope_scaling"].as_object_mut().unwrap().remove("factor");
    expect_format(load_json_config("factor", &c), &["rope_scaling.factor"]);

    let dir = temp_dir("badjson");
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\",").unwrap();
    expect_format(load_hf_config(&dir), &["invalid JSON"]);

    let err = load_hf_config(&temp_dir("absent")).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }) && err.to_string().contains("config.json"));
}

#[test]
fn unsupported_architectures_and_rope_types_name_the_value() {
    let mut c = base_config();
    c["model_type"] = json!("mistral");
    expect_unsupported(load_json_config("arch", &c), &["model_type", "mistral"]);

    let mut c = base_config();
    c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
    expect_unsupported(load_json_config("yarn", &c), &["yarn"]);

    let mut c = base_config();
    c["attention_bias"] = json!(true);
    expect_unsupported(load_json_config("bias", &c), &["attention_bias"]);
}

#[test]
fn defaults_and_legacy_keys() {
    let mut c = base_config();
    let obj = c.as_object_mut().unwrap();
    obj.remove("head_dim");
    obj.remove("num_key_value_heads");
    obj.remove("tie_word_embeddings");
    obj.remove("rope_theta");
    obj["rope_scaling"] = json!({
        "type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
        "original_max_position_embeddings": 32
    });
    let cfg = load_json_config("defaults", &c).unwrap();
    assert_eq!(cfg.head_dim, 64 / 4);
    assert_eq!(cfg.num_kv_heads, 4);
    assert!(!cfg.tie_word_embeddings);
    assert_eq!(cfg.rope_theta, 10000.0);
    assert_eq!(cfg.rope_scaling, llama_expected().rope_scaling);

    let mut c = base_config();
    c["rope_scaling"] = json!({"rope_type": "default"});
    c["head_dim"] = Value::Null;
    let cfg = load_json_config("default_rope", &c).unwrap();
    assert_eq!(cfg.rope_scaling, None);
    assert_eq!(cfg.head_dim, 16);

    // transformers 5 names the expert count `num_local_experts`.
    let mut c = read_json(&fixture("qwen3_moe/config.json"));
    let n = c.as_object_mut().unwrap().remove("num_experts").unwrap();
    c["num_local_experts"] = n;
    let cfg = load_json_config("local_experts", &c).unwrap();
    assert_eq!(cfg.moe.unwrap().num_experts, 8);
}

/// The committed tokenizer loads in the Rust `tokenizers` crate and gives the prompt ids of
/// `ref.json` (made by the Python `tokenizers` library), so the logits references are usable.
#[test]
fn fixture_tokenizer_reproduces_the_reference_prompt_ids() {
    for name in ["qwen3", "gemma3"] {
        check_reference_prompt_ids(name);
    }
}

fn check_reference_prompt_ids(name: &str) {
    let tok = tokenizers::Tokenizer::from_file(fixture(&format!("{name}/tokenizer.json"))).unwrap();
    let reference = read_json(&fixture(&format!("{name}/ref.json")));
    for prompt in reference["prompts"].as_array().unwrap() {
        let text = prompt["text"].as_str().unwrap();
        let want: Vec<u32> = prompt["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, false).unwrap().get_ids(), want, "{text:?}");
    }
}
