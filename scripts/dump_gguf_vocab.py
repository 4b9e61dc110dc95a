#!/usr/bin/env python3
"""Dump the tokenizer metadata of a GGUF file to JSON, for Vigil's tokenizer tests.

The JSON mirrors `vigil_model::tokenizer::GgufVocab` field by field, read with the reference
GGUF reader (the Python `gguf` package), so the Rust tests can build a GGUF tokenizer without
depending on Vigil's own GGUF parser.

Usage: dump_gguf_vocab.py MODEL.gguf OUT.json
"""
import json
import sys

from gguf import GGUFReader


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reader = GGUFReader(sys.argv[1])
    vocab = {
        "model": field(reader, "tokenizer.ggml.model"),
        "pre": field(reader, "tokenizer.ggml.pre"),
        "tokens": field(reader, "tokenizer.ggml.tokens"),
        "token_types": field(reader, "tokenizer.ggml.token_type") or [],
        "merges": field(reader, "tokenizer.ggml.merges") or [],
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "eot_token_id": field(reader, "tokenizer.ggml.eot_token_id"),
        "padding_token_id": field(reader, "tokenizer.ggml.padding_token_id"),
        "add_bos_token": field(reader, "tokenizer.ggml.add_bos_token"),
        "add_eos_token": field(reader, "tokenizer.ggml.add_eos_token"),
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(vocab, out, ensure_ascii=False)


if __name__ == "__main__":
    main()
