#!/usr/bin/env python3
"""Reference fixtures for vigil-kernels' matmul and activation quantization tests.

The weights are quantized and dequantized by the `gguf` package (the reference
implementation of the GGML block formats); activations are quantized with ggml's reference
semantics (Q8_0 by `gguf`, Q8_K re-implemented below from `quantize_row_q8_K_ref`). The
expected output is the float64 product of the dequantized weights and activations, which
the Rust kernels must match to rounding.

Run: /work/venv/bin/python scripts/gen_matmul_fixtures.py
Writes crates/vigil-kernels/tests/fixtures/matmul/ (little-endian raw files):
  <fmt>.w.bin          weight bytes, ROWS rows x COLS columns in GGML layout
  <fmt>.x.bin          f32 activations, M rows x COLS
  <fmt>.expected.bin   f64, M x ROWS
  <fmt>.scale.bin      f64, M x ROWS: sum |w| |x| (for tolerances)
  quantize_q8_0.x.bin / quantize_q8_0.blocks.bin   gguf Q8_0 of tricky rows
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

ROWS, COLS, M = 5, 512, 3
OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "vigil-kernels", "tests", "fixtures", "matmul")
rng = np.random.default_rng(20240601)


def q8k_dequant(x):
    """ggml quantize_row_q8_K_ref, then dequantize (d * q)."""
    out = np.zeros_like(x, dtype=np.float32)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 256):
            blk = x[r, b:b + 256].astype(np.float32)
            i = int(np.argmax(np.abs(blk)))
            mx = blk[i]
            if np.abs(blk).max() == 0:
                continue
            iscale = np.float32(-127.0) / mx
            q = np.minimum(127, np.rint((iscale * blk).astype(np.float32)))
            d = np.float32(1.0) / iscale
            out[r, b:b + 256] = (d * q.astype(np.float32)).astype(np.float32)
    return out


def q8_0_dequant(x):
    return quants.dequantize(quants.quantize(x, T.Q8_0), T.Q8_0)


def random_k_blocks(qtype, n_blocks):
    size = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype == T.Q6_K:
        raw[:, 208:210] = d
    else:
        dmin = rng.uniform(0.001, 0.01, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, 0:2] = d
        raw[:, 2:4] = dmin
    return raw


def write(name, arr):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def case(name, qtype, act):
    wf = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.05
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        raw = random_k_blocks(qtype, ROWS * COLS // 256)
        wbytes = raw.reshape(ROWS, -1)
    elif qtype == T.F32:
        wbytes = wf.view(np.uint8)
    elif qtype == T.F16:
        wbytes = wf.astype(np.float16).view(np.uint8)
    else:
        wbytes = quants.quantize(wf, qtype)
    wdeq = quants.dequantize(wbytes, qtype).reshape(ROWS, COLS).astype(np.float64)
    x = rng.standard_normal((M, COLS)).astype(np.float32)
    xdeq = act(x).astype(np.float64)
    write(f"{name}.w.bin", wbytes)
    write(f"{name}.x.bin", x)
    write(f"{name}.expected.bin", xdeq @ wdeq.T)
    write(f"{name}.scale.bin", np.abs(xdeq) @ np.abs(wdeq).T)


def main():
    os.makedirs(OUT, exist_ok=True)
    ident = lambda x: x
    case("q4_0", T.Q4_0, q8_0_dequant)
    case("q4_1", T.Q4_1, q8_0_dequant)  # Q8_1 has Q8_0's quants and scale
    case("q8_0", T.Q8_0, q8_0_dequant)
    case("q4_k", T.Q4_K, q8k_dequant)
    case("q5_k", T.Q5_K, q8k_dequant)
    case("q6_k", T.Q6_K, q8k_dequant)
    case("f32", T.F32, ident)
    case("f16", T.F16, ident)
    case("bf16", T.BF16, ident)

    # Q8_0 activation quantization, including exact halves (amax 127 gives d = 1) and a zero
    # block: ggml's roundf rounds halves away from zero.
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, :32] = np.linspace(-127, 127, 32).astype(np.float32)
    x[0, 1:8] = [2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5]
    x[1, :32] = 0.0
    x[2, 32:] *= 1e-3
    write("quantize_q8_0.x.bin", x)
    write("quantize_q8_0.blocks.bin", quants.quantize(x, T.Q8_0))


if __name__ == "__main__":
    main()
