#!/usr/bin/env python3
"""Make a Qwen3-architecture checkpoint of the real Qwen3-0.6B shape with random weights, for
speed benchmarks (scripts/bench_qwen3_shape.sh): the same weights three ways.

    /work/venv/bin/python scripts/make_qwen3_shape.py [OUT_DIR] [--check]

OUT_DIR (default /work/cache/qwen3-0.6b-shape; ~3 GB, keep it out of the repo) receives:
  hf/                      config.json (Qwen3-0.6B's own values), generation_config.json,
                           model.safetensors (BF16, tied embeddings: no lm_head.weight) and the
                           real Qwen3 tokenizer files
  qwen3-0.6b-shape-bf16.gguf   the same BF16 matrices (norms F32, as llama.cpp's converter
                           stores 1-D tensors), arch `qwen3`, with the tokenizer metadata
  qwen3-0.6b-shape-q8_0.gguf   the BF16 GGUF quantized by llama.cpp's own quantizer
                           ($LLAMACPP_BIN/llama-quantize when set, else
                           llama_cpp.llama_model_quantize), so llama.cpp runs its native Q8_0

Weights: normal(0, 0.02) rounded to BF16, norms 1 (fixed seed). No torch: the safetensors file is
written by hand (numpy has no bfloat16), and the GGUF reuses its bytes through a memmap, so the
two formats hold bit-identical matrices. --check loads both GGUFs with llama.cpp and generates
a token from each.
"""

import ctypes
import json
import os
import shutil
import struct
import sys

import gguf
import numpy as np

TOKENIZER_DIR = "/work/main/.cache/tokenizers/qwen3"
DEFAULT_OUT = "/work/cache/qwen3-0.6b-shape"

# Qwen/Qwen3-0.6B config.json (transformers 4.51 key style).
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}
BOS_ID, EOS_ID, PAD_ID = 151643, 151645, 151643


def tensor_layout(c):
    """(HF name, GGUF name, shape, is_norm) of every tensor, in file order."""
    h, kv, hd, ff, v = (
        c["hidden_size"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["intermediate_size"],
        c["vocab_size"],
    )
    qd = c["num_attention_heads"] * hd
    out = [("model.embed_tokens.weight", "token_embd.weight", (v, h), False)]
    for i in range(c["num_hidden_layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", (h,), True),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", (qd, h), False),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv * hd, h), False),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv * hd, h), False),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", (h, qd), False),
            (p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", (hd,), True),
            (p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", (hd,), True),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (h,), True),
            (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (ff, h), False),
            (p + "mlp.up_proj.weight", g + "ffn_up.weight", (ff, h), False),
            (p + "mlp.down_proj.weight", g + "ffn_down.weight", (h, ff), False),
        ]
    out.append(("model.norm.weight", "output_norm.weight", (h,), True))
    return out


def to_bf16_bits(x):
    """float32 → bfloat16 bit patterns (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, layout, seed=0):
    """Hand-written safetensors: 8-byte header length, JSON header, then the raw tensors."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, _, shape, _ in layout:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, shape, is_norm in layout:
            if is_norm:
                data = to_bf16_bits(np.ones(shape, dtype=np.float32))
            else:
                data = to_bf16_bits(rng.standard_normal(shape, dtype=np.float32) * 0.02)
            data.tofile(f)
    return 8 + len(blob), header


def write_hf(hf_dir):
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, name), hf_dir)
    layout = tensor_layout(CONFIG)
    data_start, header = write_safetensors(os.path.join(hf_dir, "model.safetensors"), layout)
    return layout, data_start, header


def add_vocab(w, hf_dir, n_vocab):
    """GPT-2 style BPE metadata as llama.cpp's converter writes it for Qwen2/Qwen3."""
    tok = json.load(open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8"))
    tok_cfg = json.load(open(os.path.join(hf_dir, "tokenizer_config.json"), encoding="utf-8"))
    by_id = {i: (t, gguf.TokenType.NORMAL) for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        kind = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
        by_id[a["id"]] = (a["content"], kind)
    tokens, types = [], []
    for i in range(n_vocab):
        t, kind = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED))
        tokens.append(t)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(False)
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])


def write_gguf_bf16(path, hf_dir, layout, data_start, header):
    c = CONFIG
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_name("Qwen3-0.6B-shape (random weights)")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(float(c["rope_theta"]))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    add_vocab(w, hf_dir, c["vocab_size"])
    st = np.memmap(os.path.join(hf_dir, "model.safetensors"), dtype=np.uint8, mode="r")
    for hf_name, gguf_name, shape, is_norm in layout:
        lo, hi = header[hf_name]["data_offsets"]
        bits = st[data_start + lo : data_start + hi].view(np.uint16).reshape(shape)
        if is_norm:  # llama.cpp's converter keeps 1-D tensors in F32
            w.add_tensor(gguf_name, (bits.astype(np.uint32) << 16).view(np.float32))
        else:
            w.add_tensor(gguf_name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize_q8_0(src, dst):
    # A native llama.cpp build (scripts/setup_llamacpp.sh) when LLAMACPP_BIN names one.
    native = os.environ.get("LLAMACPP_BIN")
    if native:
        import subprocess

        subprocess.run([os.path.join(native, "llama-quantize"), src, dst, "Q8_0"], check=True,
                       stdout=subprocess.DEVNULL)
        return
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")


def check_llamacpp(path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, verbose=False)
    out = llm("Hello", max_tokens=1, temperature=0.0)
    print(f"llama.cpp loaded {os.path.basename(path)}: n_vocab {llm.n_vocab()}, "
          f"generated {out['choices'][0]['text']!r}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else DEFAULT_OUT
    hf_dir = os.path.join(out, "hf")
    bf16 = os.path.join(out, "qwen3-0.6b-shape-bf16.gguf")
    q8 = os.path.join(out, "qwen3-0.6b-shape-q8_0.gguf")
    layout, data_start, header = write_hf(hf_dir)
    print(f"wrote {hf_dir}")
    write_gguf_bf16(bf16, hf_dir, layout, data_start, header)
    print(f"wrote {bf16}")
    quantize_q8_0(bf16, q8)
    print(f"wrote {q8}")
    if "--check" in sys.argv:
        check_llamacpp(bf16)
        check_llamacpp(q8)


if __name__ == "__main__":
    main()
