#!/usr/bin/env python3
"""Dequantize a GGUF checkpoint into a Hugging Face folder (float32) for peers that read no GGUF.

    "$VLLM_PYTHON" scripts/make_hf_from_gguf.py [OUT_DIR] [--gguf FILE]

GGUF defaults to .cache/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_test_assets.sh fetches it);
OUT_DIR defaults to ~/.cache/vigil-peers/smollm2-135m-hf-f32 (keep it out of the repo). OUT_DIR
receives what `save_pretrained` writes: config.json, generation_config.json, model.safetensors
(float32) and the tokenizer files (tokenizer.json, tokenizer_config.json, with the GGUF's chat
template). The weights are the GGUF's Q4_1 blocks dequantized by transformers' GGUF loader (which
uses the `gguf` package), so a peer serving this folder computes with the same values Vigil's
Q4_1 path dequantizes to, in float32 instead of Q4_1 integer dot products.

Needs torch, transformers, accelerate (transformers' GGUF loader asks for it) and gguf:
scripts/setup_vllm_cpu.sh installs them in its venv and runs this once. Writes into a temporary
sibling folder and renames it, so OUT_DIR either is complete or does not exist. Deterministic:
two runs write byte-identical files. No hub access (HF_HUB_OFFLINE=1).
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path.home() / ".cache" / "vigil-peers" / "smollm2-135m-hf-f32"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="GGUF file to dequantize")
    args = ap.parse_args()

    gguf = args.gguf.resolve()
    out = args.out.resolve()
    if not gguf.is_file():
        print(f"make_hf_from_gguf: {gguf} not found (scripts/fetch_test_assets.sh fetches it)",
              file=sys.stderr)
        return 1
    if (out / "config.json").is_file():
        print(f"make_hf_from_gguf: {out} exists, nothing to do", file=sys.stderr)
        return 0

    # Everything is local: no hub look-ups (each would wait for a network timeout here).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"make_hf_from_gguf: dequantizing {gguf.name} into {out}", file=sys.stderr)
    # transformers' GGUF loader takes the folder and the file name inside it.
    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    mkw = dict(kw, dtype=torch.float32)
    try:  # transformers ≥ 5.x keeps GGUF blocks packed unless told to unpack them
        from transformers import GgufConfig
        mkw["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **mkw)
    # The weights are dense now; drop the GGUF quantizer so save_pretrained writes plain tensors.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    bad = {n: p.dtype for n, p in model.named_parameters() if p.dtype != torch.float32}
    if bad:
        print(f"make_hf_from_gguf: parameters not float32: {bad}", file=sys.stderr)
        return 1
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    os.replace(tmp, out)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_hf_from_gguf: wrote {out} ({model.config.model_type}, {n / 1e6:.1f}M parameters, "
          f"float32)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
