//! Gemma-4's GGUF vocabularies (`tokenizer.ggml.model = "gemma4"`): SentencePiece-style text
//! (spaces written as U+2581, no space prefix) tokenized by ranked BPE merges over raw UTF-8
//! characters, not GPT-2's byte alphabet. The text splits only between runs of newlines and
//! the rest, since no merged token spans a newline; a run of newlines that is itself a token
//! stays whole. A symbol the vocabulary lacks falls back to its `<0xXX>` byte tokens. This
//! is what llama.cpp's `gemma4` vocabulary does, and what Hugging Face's Gemma-4 tokenizer
//! (BPE with byte fallback) gives.

use crate::vocab::Vocab;
use crate::{bpe, spm};

/// Appends the ids of `text` (a fragment without control tokens) to `out`.
pub fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let escaped = spm::escape_whitespace(text);
    for run in newline_runs(&escaped) {
        if run.starts_with('\n') {
            if let Some(&id) = vocab.ids.get(run) {
                out.push(id);
                continue;
            }
        }
        for symbol in bpe::merge(vocab, run) {
            match vocab.ids.get(symbol) {
                Some(&id) => out.push(id),
                None => out.extend(
                    symbol
                        .bytes()
                        .filter_map(|b| vocab.ids.get(&format!("<0x{b:02X}>")).copied()),
                ),
            }
        }
    }
}

/// `text` cut into maximal runs of newlines and of everything else, in order.
fn newline_runs(text: &str) -> Vec<&str> {
    let mut runs = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for i in 1..=bytes.len() {
        if i == bytes.len() || (bytes[i] == b'\n') != (bytes[start] == b'\n') {
            if i > start {
                runs.push(&text[start..i]);
            }
            start = i;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::TokenKind;
    use std::collections::HashMap;

    #[test]
    fn runs_split_only_at_newline_boundaries() {
        assert_eq!(newline_runs("a b\n\ncd\n"), ["a b", "\n\n", "cd", "\n"]);
        assert_eq!(newline_runs("\n"), ["\n"]);
        assert!(newline_runs("").is_empty());
    }

    /// A vocabulary of single characters, two merges, a newline pair and byte tokens.
    fn vocab() -> Vocab {
        let mut texts: Vec<String> = ["a", "b", "▁", "ab", "▁ab", "\n", "\n\n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        texts.extend((0..=255u32).map(|b| format!("<0x{b:02X}>")));
        let mut kinds = vec![TokenKind::Normal; 7];
        kinds.extend(std::iter::repeat_n(TokenKind::Byte, 256));
        let merges: HashMap<(String, String), u32> = [(("a", "b"), 0), (("▁", "ab"), 1)]
            .into_iter()
            .map(|((l, r), rank)| ((l.to_string(), r.to_string()), rank))
            .collect();
        let n = texts.len();
        Vocab::new(texts, vec![0.0; n], kinds, merges)
    }

    #[test]
    fn merges_run_over_escaped_spaces_and_unknown_characters_fall_back_to_bytes() {
        let v = vocab();
        let mut out = Vec::new();
        encode(&v, "ab ab\n\n\n\u{e9}", &mut out);
        // "ab", "▁ab", then "\n\n\n" (not a token: "\n\n" + "\n" have no merge, so three
        // "\n"), then é as its two UTF-8 bytes.
        let byte = |b: u32| 7 + b;
        assert_eq!(out, [3, 4, 5, 5, 5, byte(0xC3), byte(0xA9)]);
        let mut two = Vec::new();
        encode(&v, "\n\n", &mut two);
        assert_eq!(two, [6]);
    }
}
