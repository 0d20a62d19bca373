//! Builds a tiny SentencePiece-style ("llama") vocabulary in a GGUF buffer, then encodes and
//! decodes a sentence with it.
use strata_gguf::writer::GgufWriter;
use strata_gguf::{GgufFile, Value};
use strata_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // (text, token type): 2 unknown, 3 control, 6 byte, 1 normal.
    let mut vocab = vec![("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<0x21>", 6)];
    let pieces = "▁ ▁h ▁he ▁hel ▁hell ▁hello ▁w ▁wo ▁wor ▁worl ▁world";
    vocab.extend(pieces.split(' ').map(|piece| (piece, 1)));
    let (mut texts, mut scores, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for &(text, kind) in &vocab {
        texts.push(Value::String(text.to_string()));
        scores.push(Value::F32(text.len() as f32)); // merging prefers the longest piece
        types.push(Value::I32(kind));
    }
    let mut w = GgufWriter::new();
    w.str("tokenizer.ggml.model", "llama")
        .array("tokenizer.ggml.tokens", texts)
        .array("tokenizer.ggml.scores", scores)
        .array("tokenizer.ggml.token_type", types)
        .u32("tokenizer.ggml.unknown_token_id", 0)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2);
    let tok = Tokenizer::from_gguf(&GgufFile::from_vec(w.to_bytes())?)?;

    let text = "hello world!";
    let ids = tok.encode(text, true, false)?; // adds BOS; "!" falls back to its byte token
    let pieces: Vec<&str> = ids.iter().map(|&id| vocab[id as usize].0).collect();
    println!("{text:?} -> {ids:?} = {pieces:?}");
    // The "▁" that SentencePiece puts before the first word decodes to a space.
    println!("decoded: {:?}", tok.decode(&ids, false)?);
    println!("with special tokens: {:?}", tok.decode(&ids, true)?);
    Ok(())
}
