//! Stores one 2 x 64 matrix twice, as F32 in a safetensors buffer and as Q8_0 in a GGUF
//! buffer, then reads both through the same `WeightSource` interface.
use strata_gguf::writer::GgufWriter; // only to write the demo GGUF
use strata_weights::quant::BlockQ8_0;
use strata_weights::{write_safetensors, GgmlType, GgufModel, SafetensorsModel};
use strata_weights::{WeightSource, Weights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let values: Vec<f32> = (0..128).map(|i| (i as f32 * 0.1).sin()).collect();
    let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let st = write_safetensors(&[("w", "F32", &[2, 64], &f32_bytes)]);
    // Q8_0: blocks of 32 values, each an f16 scale followed by 32 signed 8-bit codes.
    let mut q8_bytes = Vec::new();
    for chunk in values.chunks_exact(32) {
        let block = BlockQ8_0::quantize(chunk);
        q8_bytes.extend_from_slice(&block.d.0);
        q8_bytes.extend(block.qs.iter().map(|&q| q as u8));
    }
    let mut gguf = GgufWriter::new();
    gguf.tensor("w", &[64, 2], GgmlType::Q8_0, q8_bytes); // GGUF dims: innermost first

    let sources = [
        Weights::Safetensors(SafetensorsModel::from_vec("w.safetensors", st)?),
        Weights::Gguf(GgufModel::from_vec(gguf.to_bytes())?),
    ];
    for source in &sources {
        let w = source.require("w", &[2, 64])?; // HF order: [rows, columns]
        let decoded = w.to_f32_vec()?;
        let err = decoded.iter().zip(&values).map(|(a, b)| (a - b).abs());
        let (format, ty, bytes) = (source.format(), w.ty, w.bytes.len());
        let (first, max_err) = (&decoded[..4], err.fold(0.0, f32::max));
        println!("{format} {ty}, {bytes} bytes: first values {first:.4?}");
        let dot = w.dot_row(1, &values[64..])?; // computed on the stored blocks
        println!("  max error {max_err:.4}, row 1 . row 1 = {dot:.4}");
    }
    Ok(())
}
