#!/usr/bin/env python3
"""Reference fixtures for Vigil's dequantizers, computed by the Python `gguf` package.

Writes tests/fixtures/dequant/random_<type>.in.bin (raw block bytes) and
random_<type>.out.bin (gguf.quants.dequantize output, little-endian f32) for random blocks of
every supported type. Random bytes, except that every f16 scale field is a random *finite*
f16, so no output is NaN (NaN payloads are not part of the bit-exactness contract).

Run: /work/venv/bin/python scripts/make_dequant_fixtures.py
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "dequant"

# type -> (values per block, bytes per block, byte offsets of f16 scale fields, number of blocks)
TYPES = {
    "q4_0": (T.Q4_0, 32, 18, [0], 256),
    "q4_1": (T.Q4_1, 32, 20, [0, 2], 256),
    "q8_0": (T.Q8_0, 32, 34, [0], 256),
    "q4_k": (T.Q4_K, 256, 144, [0, 2], 160),
    "q5_k": (T.Q5_K, 256, 176, [0, 2], 160),
    "q6_k": (T.Q6_K, 256, 210, [208], 160),
}
# Types added later, each from a generator of its own so the fixtures above stay as they were.
LATER_TYPES = {
    "q5_0": (T.Q5_0, 32, 22, [0], 256, 20261202),
}


def finite_f16_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite f16 values over many binades, including subnormals, zeros and negatives."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exponent = (bits >> 10) & 0x1F
    bits = np.where(exponent == 0x1F, bits & ~np.uint16(0x4000), bits).astype(np.uint16)  # no inf/nan
    return bits.view(np.uint8).reshape(n, 2)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240601)
    for name, (qtype, _bs, ts, scale_offsets, n_blocks) in TYPES.items():
        write_random_blocks(rng, name, qtype, ts, scale_offsets, n_blocks)
    # (the float formats below draw from the same generator, after the block types)
    for name, (qtype, _bs, ts, scale_offsets, n_blocks, seed) in LATER_TYPES.items():
        write_random_blocks(np.random.default_rng(seed), name, qtype, ts, scale_offsets, n_blocks)
    write_float_formats(rng)


def write_random_blocks(rng, name, qtype, ts, scale_offsets, n_blocks) -> None:
    blocks = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint16).astype(np.uint8)
    for off in scale_offsets:
        blocks[:, off:off + 2] = finite_f16_bytes(rng, n_blocks)
    expected = dequantize(blocks.reshape(-1), qtype).astype("<f4")
    assert np.isfinite(expected).all(), name
    (OUT / f"random_{name}.in.bin").write_bytes(blocks.tobytes())
    (OUT / f"random_{name}.out.bin").write_bytes(expected.tobytes())


def write_float_formats(rng) -> None:
    # Plain float formats: random non-NaN f16 / bf16 bit patterns (all binades, subnormals,
    # zeros, infinities), and random f32 words.
    all16 = rng.integers(0, 1 << 16, size=8192, dtype=np.uint32).astype(np.uint16)
    f16_ok = all16[~np.isnan(all16.view(np.float16))]
    (OUT / "random_f16.in.bin").write_bytes(f16_ok.astype("<u2").tobytes())
    (OUT / "random_f16.out.bin").write_bytes(dequantize(f16_ok.view(np.uint8), T.F16).astype("<f4").tobytes())
    bf16_ok = all16[(all16 & 0x7FFF) <= 0x7F80]
    (OUT / "random_bf16.in.bin").write_bytes(bf16_ok.astype("<u2").tobytes())
    (OUT / "random_bf16.out.bin").write_bytes(dequantize(bf16_ok.view(np.uint8), T.BF16).astype("<f4").tobytes())
    f32 = rng.standard_normal(1024).astype("<f4")
    (OUT / "random_f32.in.bin").write_bytes(f32.tobytes())
    (OUT / "random_f32.out.bin").write_bytes(dequantize(f32.view(np.uint8), T.F32).astype("<f4").tobytes())


if __name__ == "__main__":
    main()
