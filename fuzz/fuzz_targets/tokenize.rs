//! Any text through both kinds of GGUF vocabulary (byte-level BPE: SmolLM2; SentencePiece
//! with byte fallback: Gemma-3): encoding never panics or loops, gives back an error only
//! for input the pre-tokenizer cannot split, and decoding gives the text back; control-token
//! spellings in literal pieces stay text. The models come from `scripts/fetch-models.sh`
//! (`STRATA_FUZZ_MODELS`, default `../models`).
//!
//! A byte-level vocabulary may lack some bytes' tokens (SmolLM2 has none for `\r`, 0x04,
//! 0x06, 0x0e, 0x10, 0x1d and the lead bytes of planes 4 to 11); such bytes are dropped, as
//! llama.cpp drops them, so the round trip is checked on the text without them.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use strata_gguf::GgufFile;
use strata_tokenizer::{Tokenizer, TokenizerError};

const MODELS: [&str; 2] = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

/// A tokenizer and the ASCII characters its vocabulary cannot spell.
struct Vocab {
    tok: Tokenizer,
    dropped: Vec<char>,
}

fn tokenizers() -> &'static [Vocab] {
    static ALL: OnceLock<Vec<Vocab>> = OnceLock::new();
    ALL.get_or_init(|| {
        let dir = std::env::var("STRATA_FUZZ_MODELS").unwrap_or_else(|_| "../models".into());
        MODELS
            .iter()
            .map(|m| {
                let path = std::path::Path::new(&dir).join(m);
                let file = GgufFile::open(&path).unwrap_or_else(|e| {
                    panic!("{}: {e} (run scripts/fetch-models.sh)", path.display())
                });
                let tok = Tokenizer::from_gguf(&file).expect("the vocabulary loads");
                let dropped = (0u8..0x80)
                    .map(char::from)
                    .filter(|c| tok.encode(&c.to_string(), false, false).unwrap().is_empty())
                    .collect();
                Vocab { tok, dropped }
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let all = tokenizers();
    let Vocab { tok, dropped } = &all[pick as usize % all.len()];
    let text = String::from_utf8_lossy(rest);
    match tok.encode(&text, false, false) {
        Ok(ids) => {
            // Planes 4 to 11 hold no assigned characters; their lead bytes may lack tokens.
            if text.chars().all(|c| (c as u32) < 0x40000) {
                let expected: String = text.chars().filter(|c| !dropped.contains(c)).collect();
                assert_eq!(tok.decode(&ids, false).unwrap(), expected, "round trip");
            }
        }
        // The pre-tokenizer's regex gave up (a backtracking limit): a clear error.
        Err(TokenizerError::Input(_)) => return,
        Err(e) => panic!("unexpected error {e}"),
    }
    // With control tokens honoured, ids are still valid and spans lie on char boundaries.
    let ids = tok.encode(&text, true, true).expect("encoded once already");
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    for span in tok.control_spans(&text) {
        assert!(text.is_char_boundary(span.start) && text.is_char_boundary(span.end));
    }
    // A literal piece between markup keeps its control-token spellings as text.
    let mid = text.len() / 2;
    let mid = (0..=mid)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let pieces = [(&text[..mid], false), (&text[mid..], true)];
    let ids = tok
        .encode_pieces(&pieces, false)
        .expect("both halves encode");
    let literal = tok.encode(&text[mid..], false, false).unwrap();
    assert!(ids.ends_with(&literal) || literal.is_empty());
});
