//! GGUF v2/v3 reader over a memory map (filled in by the formats work).
