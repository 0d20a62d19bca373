//! decode(encode(text)) gives the text back, for any text, on the real GGUF vocabularies
//! (byte-level BPE and SentencePiece-style with byte fallback), and control-token texts in
//! it stay text when `parse_special` is off. Needs the GGUF files in models/
//! (scripts/fetch-models.sh); without them the test says so and passes.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use strata_gguf::GgufFile;
use strata_tokenizer::Tokenizer;

fn model(file: &str) -> Option<Tokenizer> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    if !path.exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh)",
            path.display()
        );
        return None;
    }
    Some(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap())
}

/// Text mixing ASCII words, whitespace runs, digits, accents, CJK, emoji and control-token
/// spellings.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z]{1,12}",
        "[ \t\n]{1,4}",
        "[0-9]{1,6}",
        "[àéîõüßçñ]{1,4}",
        "[一-龥]{1,4}",
        "[😀-🙏]{1,3}",
        "[!-/:-@]{1,3}",
        Just("<|im_end|>".to_string()),
        Just("<start_of_turn>".to_string()),
        Just("<end_of_turn>".to_string()),
    ];
    prop::collection::vec(piece, 1..24).prop_map(|v| v.concat())
}

fn round_trips(tok: &Tokenizer, text: &str) -> Result<(), TestCaseError> {
    let ids = tok.encode(text, false, false).unwrap();
    let back = tok.decode(&ids, false).unwrap();
    prop_assert_eq!(back, text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn smollm2_byte_level_bpe(t in text()) {
        if let Some(tok) = smollm2() {
            round_trips(tok, &t)?;
        }
    }

    #[test]
    fn gemma3_sentencepiece(t in text()) {
        if let Some(tok) = gemma3() {
            round_trips(tok, &t)?;
        }
    }
}

fn smollm2() -> Option<&'static Tokenizer> {
    static TOK: std::sync::OnceLock<Option<Tokenizer>> = std::sync::OnceLock::new();
    TOK.get_or_init(|| model("SmolLM2-135M-Instruct.Q4_1.gguf"))
        .as_ref()
}

fn gemma3() -> Option<&'static Tokenizer> {
    static TOK: std::sync::OnceLock<Option<Tokenizer>> = std::sync::OnceLock::new();
    TOK.get_or_init(|| model("gemma-3-270m-q4_k_m.gguf"))
        .as_ref()
}
