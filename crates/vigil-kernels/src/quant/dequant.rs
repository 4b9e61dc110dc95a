//! Block → f32 dequantization for every supported format (filled in by the formats work).
