//! A model's vocabulary as llguidance reads it: each token's bytes, special tokens marked.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// Each token's bytes as they appear in decoded text, which ids are special (control
/// tokens such as `<end_of_turn>`, never produced by a grammar's text), and the end of
/// sequence the grammar allows once it may stop.
pub struct Vocab {
    words: Vec<Vec<u8>>,
    eos: u32,
}

impl Vocab {
    /// `words[id]` is token `id`'s bytes (a special token's: its text); `special[id]` marks
    /// control tokens. Panics if the two differ in length or `eos` is out of range.
    pub fn new(words: Vec<Vec<u8>>, special: Vec<bool>, eos: u32) -> Self {
        assert_eq!(words.len(), special.len(), "one special flag per token");
        assert!(
            (eos as usize) < words.len(),
            "eos {eos} outside the vocabulary"
        );
        let words = words
            .into_iter()
            .zip(special)
            .map(|(w, s)| match s {
                // llguidance tells special tokens by this leading byte, which no UTF-8
                // text contains, so grammar text never matches them.
                true => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &w].concat(),
                false => w,
            })
            .collect();
        Self { words, eos }
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the vocabulary is empty (never, for a model's).
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The llguidance environment: the token trie and the model's own tokenizer (used for
    /// text a grammar forces, so that it is tokenized as the model would).
    pub(crate) fn env(&self, tokenize: Tokenize) -> TokEnv {
        let info = TokRxInfo::new(self.words.len() as u32, self.eos);
        Arc::new(Env {
            trie: TokTrie::from(&info, &self.words),
            tokenize,
        })
    }
}

/// Text to token ids, with the model's tokenizer (no BOS, control tokens spelled out).
pub(crate) type Tokenize = Arc<dyn Fn(&[u8]) -> Vec<u32> + Send + Sync>;

struct Env {
    trie: TokTrie,
    tokenize: Tokenize,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        (self.tokenize)(s)
    }
}
