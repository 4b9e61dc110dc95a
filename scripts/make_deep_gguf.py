#!/usr/bin/env python3
"""Write a GGUF whose transformer blocks are the source's, repeated: a deep model of the same
layer shapes, for timing decode from DRAM on a host whose last-level cache holds the real model.

    python scripts/make_deep_gguf.py SRC.gguf OUT.gguf REPEATS

SmolLM2-135M's 30 blocks (about 90 MB in Q4_0) fit in a large Xeon's L3, so its decode there
never reads weights from DRAM, while on a 32 MiB-L3 machine (the project's AMD EPYC Zen 3) every
token does. Repeated 17 times (510 blocks, about 1 GB; llama.cpp takes at most 512), the same
small matrices stream from DRAM on either host, and `bench_core --floor --breakdown` and
`llama-bench` time that regime side by side. The output is not a useful language model: block
k*N + i holds block i's tensors. Needs the `gguf` package (VLLM_PYTHON from
scripts/setup_vllm_cpu.sh has it).
"""

import sys

import gguf
import numpy as np


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    blocks = reader.fields[f"{arch}.block_count"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.block_count":
            writer.add_uint32(name, blocks * repeats)
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(name, field.contents(), kind)
    per_block: dict[int, list] = {}
    for t in reader.tensors:
        if t.name.startswith("blk."):
            per_block.setdefault(int(t.name.split(".")[1]), []).append(t)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for k in range(repeats):
        for i in range(blocks):
            for t in per_block[i]:
                rest = t.name.split(".", 2)[2]
                writer.add_tensor(
                    f"blk.{k * blocks + i}.{rest}", np.array(t.data), raw_dtype=t.tensor_type
                )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
