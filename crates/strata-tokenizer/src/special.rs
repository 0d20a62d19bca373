//! Splitting raw text around special tokens before the model's algorithm runs.

use crate::vocab::Vocab;

/// A piece of input: raw text for the tokenizer algorithm, or an already-known token.
#[derive(Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Splits `text` at every occurrence of a special token, longest tokens first. Control and
/// unknown tokens are matched only when `parse_special`; user-defined tokens always.
pub fn partition<'a>(vocab: &Vocab, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
    let mut frags = vec![Fragment::Text(text)];
    for &id in &vocab.specials {
        if !parse_special && vocab.kinds[id as usize].is_special() {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        let mut next = Vec::with_capacity(frags.len());
        for frag in frags {
            let Fragment::Text(mut rest) = frag else {
                next.push(frag);
                continue;
            };
            while let Some(at) = rest.find(needle) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(id));
                rest = &rest[at + needle.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}
