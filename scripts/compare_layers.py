#!/usr/bin/env python3
"""Layer-by-layer comparison of Vigil's forward pass with llama.cpp's graph nodes.

Inputs: an .npz from scripts/dump_llamacpp_tensors.py and a directory from
`cargo run --release -p vigil-model --example dump_layers` for the same token ids.
Prints, per node, the relative L2 error ||vigil - llama.cpp|| / ||llama.cpp|| and the max
absolute difference, so the first op whose error jumps beyond float rounding stands out.

Usage: /work/venv/bin/python scripts/compare_layers.py LLAMACPP.npz VIGIL_DIR [--layers N]
"""

import argparse
import os

import numpy as np

# Vigil probe name -> (llama.cpp node name, occurrence) ; the occurrence picks e.g. Qcur
# after RoPE (the third node named Qcur-L).
PER_LAYER = [
    ("attn_norm", 0),
    ("Qcur", 2),
    ("Kcur", 2),
    ("Vcur", 0),
    ("kqv_out", 0),
    ("attn_out", 0),
    ("ffn_inp", 0),
    ("ffn_norm", 0),
    ("ffn_up", 0),
    ("ffn_swiglu", 0),
    ("ffn_out", 0),
    ("l_out", 0),
]


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llamacpp")
    ap.add_argument("vigil")
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    lc = np.load(args.llamacpp)
    t = len(lc["seq"])

    def vig(name):
        path = os.path.join(args.vigil, name + ".f32")
        return np.fromfile(path, dtype="<f4").reshape(t, -1)

    def ref(name, occ):
        return lc[f"{name}#{occ}"].reshape(t, -1)

    rows = [("embd", "embd", 0)]
    for layer in range(args.layers):
        rows += [(f"{n}-{layer}", f"{n}-{layer}", occ) for n, occ in PER_LAYER]
    rows += [("result_norm", "result_norm", 0), ("result_output", "result_output", 0)]
    print(f"{'node':<16} {'rel L2':>10} {'max |Δ|':>10} {'rms ref':>10}")
    for vname, lname, occ in rows:
        try:
            a, b = vig(vname), ref(lname, occ)
        except (FileNotFoundError, KeyError) as e:
            print(f"{vname:<16} missing ({e})")
            continue
        print(f"{vname:<16} {rel(a, b):10.2e} {np.abs(a - b).max():10.3e} {np.sqrt((b**2).mean()):10.3e}")
    a, b = vig("result_output"), ref("result_output", 0)
    agree = int((a.argmax(1) == b.argmax(1)).sum())
    print(f"top-1 agreement on this sequence: {agree}/{t}")


if __name__ == "__main__":
    main()
