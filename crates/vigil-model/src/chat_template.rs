//! Chat templates rendered with minijinja, byte-identical to HF transformers (filled in by the tokenizer work).
