//! Writes a small GGUF file, opens it again and prints its metadata and tensor directory.
use strata_gguf::writer::GgufWriter;
use strata_gguf::{GgmlType, GgufFile, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A 2x3 f32 matrix (dims innermost first, as ggml orders them) and a 3-element bias.
    let weight: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bias: Vec<u8> = [0.5f32; 3].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .f32("llama.rope.freq_base", 10000.0)
        .array("tokenizer.ggml.tokens", vec![Value::String("<s>".into())])
        .tensor("blk.0.w", &[3, 2], GgmlType::F32, weight)
        .tensor("blk.0.b", &[3], GgmlType::F32, bias);
    let path = std::env::temp_dir().join("strata-gguf-example.gguf");
    std::fs::write(&path, w.to_bytes())?;

    let file = GgufFile::open(&path)?; // memory-mapped; GgufFile::from_vec parses a Vec<u8>
    let arch = file.architecture().unwrap_or("?");
    println!(
        "GGUF v{}, {arch}, tensor data at byte {}",
        file.version, file.data_offset
    );
    for (key, value) in file.metadata() {
        println!("  {key} ({}) = {value:?}", value.type_name());
    }
    for t in file.tensors() {
        let first = f32::from_le_bytes(file.tensor_data(t)[..4].try_into()?);
        let (name, ty, dims, len) = (&t.name, t.ggml_type, &t.dims, t.byte_len());
        println!(
            "  {name} {ty} {dims:?}: {len} bytes at +{}, first {first}",
            t.offset
        );
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
