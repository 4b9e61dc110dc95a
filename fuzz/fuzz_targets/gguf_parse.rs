//! Fuzz the GGUF header parser: any input must parse or return an error, never panic, and a
//! header that parses must describe tensors whose bytes lie in the input and dequantize.
//! Seed the corpus with `tests/fixtures/gguf/small.gguf`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vigil_kernels::quant::dequant::dequantize;
use vigil_model::gguf::GgufHeader;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = GgufHeader::parse(data, Path::new("fuzz.gguf")) else {
        return;
    };
    for t in &header.tensors {
        let start = (header.data_offset + t.offset) as usize;
        let bytes = &data[start..start + t.n_bytes() as usize];
        // Bound the work per input: only small tensors are dequantized.
        if bytes.len() <= 1 << 16 {
            let mut out = vec![0.0; t.n_elements() as usize];
            dequantize(t.dtype, bytes, &mut out).expect("validated tensor must dequantize");
        }
    }
});
