//! Entry points shared by the `cargo fuzz` targets and the tests that replay their corpus.
//! Each one parses untrusted bytes and then touches everything the parse handed out; any
//! panic is a bug.

use crate::{GgufModel, SafetensorsModel, WeightSource};

/// Parses a GGUF file and decodes (a prefix of) every tensor it lists.
pub fn gguf(data: &[u8]) {
    if let Ok(model) = GgufModel::from_vec(data.to_vec()) {
        exercise(&model);
    }
}

/// Parses a safetensors file and decodes (a prefix of) every tensor it lists.
pub fn safetensors(data: &[u8]) {
    if let Ok(model) = SafetensorsModel::from_vec("fuzz", data.to_vec()) {
        exercise(&model);
    }
}

fn exercise(source: &dyn WeightSource) {
    for name in source.names() {
        let Some(view) = source.get(name) else {
            continue;
        };
        // Bound the work per tensor: a header can claim a huge tensor over few real bytes
        // only if the bytes are there, but decoding gigabytes would stall the fuzzer.
        // A zero-element tensor can still claim a huge row length, so bound both.
        if view.elements() <= 1 << 16 && view.row_len() <= 1 << 16 {
            let _ = view.to_f32_vec();
            let x = vec![1.0f32; view.row_len()];
            let _ = view.dot_row(0, &x);
            let _ = view.dot_row(view.rows().saturating_sub(1), &x);
        }
        let _ = view.as_f32();
        let _ = view.row(view.rows());
    }
}
