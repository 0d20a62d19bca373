//! Byte-level BPE of GGUF "gpt2" vocabularies (SmolLM, Llama-3, Qwen): pre-tokenize with the
//! model's regular expressions, map bytes to printable characters, then apply ranked merges.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use fancy_regex::Regex;

use crate::vocab::Vocab;
use crate::TokenizerError;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer: regular expressions applied in turn; each splits every piece into its
/// matches and the text between them.
pub struct PreTokenizer {
    stages: Vec<Regex>,
}

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre`.
    pub fn named(name: &str) -> Result<Self, TokenizerError> {
        let patterns: &[&str] = match name {
            "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" => &[GPT2],
            "smollm" | "starcoder" | "refact" | "codeshell" => &[r"\p{N}", GPT2],
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" => &[LLAMA3],
            "qwen2" => &[QWEN2],
            other => {
                return Err(TokenizerError::Unsupported(format!(
                "tokenizer.ggml.pre = {other:?} (known: default, gpt2, smollm, llama-bpe, qwen2)"
            )))
            }
        };
        let stages = patterns
            .iter()
            .map(|p| {
                Regex::new(p)
                    .map_err(|e| TokenizerError::Invalid(format!("pre-tokenizer regex: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { stages })
    }

    /// Splits `text` into pieces. A match the regex engine gives up on (fancy-regex's
    /// backtracking limit, reached on pathological input such as a megabyte-long word) is an
    /// error: its iterator yields the error again at the same position, so skipping it would
    /// loop for ever.
    pub fn split<'a>(&self, text: &'a str) -> Result<Vec<&'a str>, TokenizerError> {
        let mut pieces = vec![text];
        for re in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = m.map_err(|e| {
                        TokenizerError::Input(format!(
                            "the pre-tokenizer gave up on a piece of {} bytes at byte {last}: {e}",
                            piece.len()
                        ))
                    })?;
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }
}

/// GPT-2's reversible map from bytes to printable characters.
fn byte_chars() -> &'static ([char; 256], std::collections::HashMap<char, u8>) {
    static MAP: OnceLock<([char; 256], std::collections::HashMap<char, u8>)> = OnceLock::new();
    MAP.get_or_init(|| {
        let printable = |b: u32| {
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
        };
        let mut chars = ['\0'; 256];
        let mut extra = 0;
        for b in 0..256u32 {
            chars[b as usize] = if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            };
        }
        let back = chars
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        (chars, back)
    })
}

/// Bytes -> their printable-character spelling.
pub fn encode_bytes(bytes: &[u8]) -> String {
    let (chars, _) = byte_chars();
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// The printable-character spelling -> bytes (characters outside the map pass through as UTF-8).
pub fn decode_bytes(text: &str) -> Vec<u8> {
    let (_, back) = byte_chars();
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match back.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Pair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pair {
    /// Lowest rank first, then leftmost (BinaryHeap pops the greatest).
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then_with(|| o.left.cmp(&self.left))
    }
}

/// Appends the ids of one pre-tokenized piece.
pub fn encode_piece(vocab: &Vocab, piece: &str, out: &mut Vec<u32>) {
    let word = encode_bytes(piece.as_bytes());
    for text in merge(vocab, &word) {
        match vocab.ids.get(text) {
            Some(&id) => out.push(id),
            None => {
                for c in text.chars() {
                    if let Some(&id) = vocab.ids.get(c.to_string().as_str()) {
                        out.push(id);
                    }
                }
            }
        }
    }
}

/// The symbols `word` ends as once its characters are merged by rank, lowest first (the
/// leftmost of equal ranks first), in order.
pub(crate) fn merge<'a>(vocab: &Vocab, word: &'a str) -> Vec<&'a str> {
    // (start, len) per symbol in `word`, plus linked-list neighbours.
    let mut sym: Vec<(usize, usize)> = word
        .char_indices()
        .map(|(i, c)| (i, c.len_utf8()))
        .collect();
    let n = sym.len();
    let mut next: Vec<Option<usize>> = (0..n).map(|i| (i + 1 < n).then_some(i + 1)).collect();
    let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
    let mut heap = BinaryHeap::new();
    let rank_of = |sym: &[(usize, usize)], l: usize, r: usize| {
        let a = &word[sym[l].0..sym[l].0 + sym[l].1];
        let b = &word[sym[r].0..sym[r].0 + sym[r].1];
        vocab
            .merge_ranks
            .get(&(a.to_string(), b.to_string()))
            .copied()
    };
    for i in 1..n {
        if let Some(rank) = rank_of(&sym, i - 1, i) {
            heap.push(Pair {
                rank,
                left: i - 1,
                right: i,
                len: sym[i - 1].1 + sym[i].1,
            });
        }
    }
    while let Some(p) = heap.pop() {
        if sym[p.left].1 == 0
            || sym[p.right].1 == 0
            || next[p.left] != Some(p.right)
            || sym[p.left].1 + sym[p.right].1 != p.len
        {
            continue;
        }
        sym[p.left].1 += sym[p.right].1;
        sym[p.right].1 = 0;
        next[p.left] = next[p.right];
        if let Some(nx) = next[p.left] {
            prev[nx] = Some(p.left);
        }
        if let Some(pv) = prev[p.left] {
            if let Some(rank) = rank_of(&sym, pv, p.left) {
                heap.push(Pair {
                    rank,
                    left: pv,
                    right: p.left,
                    len: sym[pv].1 + sym[p.left].1,
                });
            }
        }
        if let Some(nx) = next[p.left] {
            if let Some(rank) = rank_of(&sym, p.left, nx) {
                heap.push(Pair {
                    rank,
                    left: p.left,
                    right: nx,
                    len: sym[p.left].1 + sym[nx].1,
                });
            }
        }
    }
    let mut symbols = Vec::new();
    let mut cur = (n > 0).then_some(0);
    while let Some(i) = cur {
        symbols.push(&word[sym[i].0..sym[i].0 + sym[i].1]);
        cur = next[i];
    }
    symbols
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_ordinary_text_whole() {
        let pre = PreTokenizer::named("smollm").unwrap();
        let text = "Hello world, 42 times!";
        let pieces = pre.split(text).unwrap();
        assert_eq!(pieces.concat(), text);
        assert_eq!(
            pieces,
            ["Hello", " world", ",", " ", "4", "2", " times", "!"]
        );
    }

    #[test]
    fn a_regex_that_gives_up_is_an_error_not_a_loop() {
        // A megabyte-long word exhausts fancy-regex's backtracking budget; its iterator then
        // yields the same error for ever, which once hung the caller.
        for name in ["smollm", "llama-bpe", "qwen2", "gpt2"] {
            let pre = PreTokenizer::named(name).unwrap();
            let word = "a".repeat(1 << 20);
            match pre.split(&word) {
                Err(TokenizerError::Input(msg)) => assert!(msg.contains("gave up"), "{msg}"),
                other => panic!("{name}: expected the regex's error, got {other:?}"),
            }
        }
    }
}
