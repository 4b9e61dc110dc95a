//! Tokenizers: `tokenizer.json` and GGUF-embedded vocabularies (filled in by the tokenizer work).
