//! SentencePiece-style tokenization of GGUF "llama" vocabularies (Gemma, Llama-2): start from
//! single characters and repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring token; characters left unknown fall back to byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// The visible-space character SentencePiece uses for ' '.
pub const SPACE: char = '\u{2581}';

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Highest score first; among equal scores the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` (already whitespace-escaped) to `out`.
pub fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let mut syms: Vec<Symbol> = text
        .char_indices()
        .map(|(i, c)| Symbol {
            start: i,
            len: c.len_utf8(),
            prev: None,
            next: None,
        })
        .collect();
    let n = syms.len();
    for (i, s) in syms.iter_mut().enumerate() {
        s.prev = i.checked_sub(1);
        s.next = (i + 1 < n).then_some(i + 1);
    }
    let mut heap = BinaryHeap::new();
    let try_pair = |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: usize, right: usize| {
        let (a, b) = (&syms[left], &syms[right]);
        let piece = &text[a.start..b.start + b.len];
        if let Some(&id) = vocab.ids.get(piece) {
            heap.push(Bigram {
                score: vocab.scores[id as usize],
                left,
                right,
                len: piece.len(),
            });
        }
    };
    for i in 1..n {
        try_pair(&mut heap, &syms, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (&syms[b.left], &syms[b.right]);
        // Skip pairs invalidated by an earlier merge.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != Some(b.right) {
            continue;
        }
        let right_next = syms[b.right].next;
        syms[b.left].len += syms[b.right].len;
        syms[b.right].len = 0;
        syms[b.left].next = right_next;
        if let Some(nx) = right_next {
            syms[nx].prev = Some(b.left);
        }
        if let Some(p) = syms[b.left].prev {
            try_pair(&mut heap, &syms, p, b.left);
        }
        if let Some(nx) = right_next {
            try_pair(&mut heap, &syms, b.left, nx);
        }
    }
    let mut cur = Some(0);
    while let Some(i) = cur {
        let s = &syms[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.ids.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for byte in piece.bytes() {
                    match vocab.ids.get(&format!("<0x{byte:02X}>")) {
                        Some(&id) => out.push(id),
                        None => out.extend(vocab.unk),
                    }
                }
            }
        }
        cur = s.next;
    }
}

/// SentencePiece's whitespace escaping.
pub fn escape_whitespace(text: &str) -> String {
    text.replace(' ', "\u{2581}")
}

/// The bytes a token stands for when decoding.
pub fn piece_bytes(text: &str) -> Vec<u8> {
    if let Some(hex) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if hex.len() == 2 {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
    }
    text.replace(SPACE, " ").into_bytes()
}
