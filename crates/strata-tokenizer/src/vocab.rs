//! A vocabulary as GGUF stores it: token texts, scores, types and (for BPE) merges.

use std::collections::HashMap;

use strata_gguf::{GgufFile, Value};

use crate::TokenizerError;

/// `tokenizer.ggml.token_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// An ordinary token (also any type id GGUF defines but this crate does not).
    Normal,
    /// The unknown-token placeholder.
    Unknown,
    /// A control token (`<start_of_turn>`, `<|im_end|>`), matched in text only on request.
    Control,
    /// A user-defined token, always matched in raw text as written.
    UserDefined,
    /// A reserved, unused id.
    Unused,
    /// A byte-fallback token (`<0xNN>`).
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i64) -> Self {
        match v {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Control and unknown tokens are "special": matched in text only on request and
    /// dropped from decoded text unless asked for.
    pub fn is_special(self) -> bool {
        matches!(self, TokenKind::Control | TokenKind::Unknown)
    }
}

/// Token texts that end a turn in some model family.
const END_OF_TURN_SPELLINGS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<turn|>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Token texts and their attributes, with the lookups both tokenizer algorithms need.
#[derive(Debug)]
pub struct Vocab {
    /// Token texts, indexed by id.
    pub texts: Vec<String>,
    /// SentencePiece merge scores, indexed by id (0 where the file has none).
    pub scores: Vec<f32>,
    /// Token types, indexed by id (end-of-turn spellings forced to `Control`).
    pub kinds: Vec<TokenKind>,
    /// Text -> id; on duplicate texts the highest id wins.
    pub ids: HashMap<String, u32>,
    /// BPE merges: (left, right) -> rank.
    pub merge_ranks: HashMap<(String, String), u32>,
    /// Control, unknown and user-defined tokens, longest text first: the ones matched in raw
    /// text before running the model's algorithm.
    pub specials: Vec<u32>,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Unknown-token id.
    pub unk: Option<u32>,
    /// Whether encoding with special tokens starts with BOS.
    pub add_bos: bool,
    /// Whether encoding with special tokens ends with EOS.
    pub add_eos: bool,
    /// Whether SentencePiece encoding puts a space before the text (its `▁` prefix).
    pub add_space_prefix: bool,
}

fn strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
            .map(Some)
            .ok_or_else(|| TokenizerError::Invalid(format!("{key} must be a list of strings"))),
    }
}

impl Vocab {
    /// Reads `tokenizer.ggml.*`: tokens, scores, types, merges, special ids and flags.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let texts = strings(file, "tokenizer.ggml.tokens")?
            .ok_or_else(|| TokenizerError::Invalid("GGUF has no tokenizer.ggml.tokens".into()))?;
        let n = texts.len();
        let list = |key: &str| -> Result<Option<&[Value]>, TokenizerError> {
            match file.get(key).map(|v| v.as_array()) {
                None => Ok(None),
                Some(Some(items)) if items.len() == n => Ok(Some(items)),
                Some(_) => Err(TokenizerError::Invalid(format!(
                    "{key} must be a list of {n} entries"
                ))),
            }
        };
        let scores = match list("tokenizer.ggml.scores")? {
            Some(items) => items
                .iter()
                .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                .collect(),
            None => vec![0.0; n],
        };
        let kinds = match list("tokenizer.ggml.token_type")? {
            Some(items) => items
                .iter()
                .map(|v| TokenKind::from_gguf(v.as_i64().unwrap_or(1)))
                .collect(),
            None => vec![TokenKind::Normal; n],
        };
        let mut merge_ranks = HashMap::new();
        for (rank, m) in strings(file, "tokenizer.ggml.merges")?
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let Some((l, r)) = m.split_once(' ') else {
                return Err(TokenizerError::Invalid(format!(
                    "merge #{rank} {m:?} has no space"
                )));
            };
            merge_ranks.insert((l.to_string(), r.to_string()), rank as u32);
        }
        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match file.get(key).and_then(Value::as_u64) {
                Some(v) if (v as usize) < n => Ok(Some(v as u32)),
                Some(v) => Err(TokenizerError::Invalid(format!(
                    "{key} = {v} is outside the vocabulary of {n}"
                ))),
                None => Ok(None),
            }
        };
        let flag =
            |key: &str, default: bool| file.get(key).and_then(Value::as_bool).unwrap_or(default);
        let model = file
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("llama");
        let mut v = Vocab::new(texts, scores, kinds, merge_ranks);
        v.bos = id("tokenizer.ggml.bos_token_id")?;
        v.eos = id("tokenizer.ggml.eos_token_id")?;
        v.unk = id("tokenizer.ggml.unknown_token_id")?;
        // Gemma-4 GGUFs may say add_bos_token = false, yet the model needs BOS: llama.cpp
        // overrides the flag for this vocabulary, and so does Strata.
        v.add_bos = flag("tokenizer.ggml.add_bos_token", model == "llama") || model == "gemma4";
        v.add_eos = flag("tokenizer.ggml.add_eos_token", false);
        v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", model == "llama");
        Ok(v)
    }

    /// A vocabulary without special ids or flags; end-of-turn spellings become `Control` as
    /// llama.cpp does.
    pub fn new(
        texts: Vec<String>,
        scores: Vec<f32>,
        mut kinds: Vec<TokenKind>,
        merge_ranks: HashMap<(String, String), u32>,
    ) -> Self {
        // llama.cpp treats these end-of-turn spellings as control tokens whatever the file
        // says (e.g. Gemma's user-defined "</s>"), so they are only matched in text when
        // special tokens are parsed. Matching llama.cpp keeps GGUF token ids identical.
        for (text, kind) in texts.iter().zip(kinds.iter_mut()) {
            if END_OF_TURN_SPELLINGS.contains(&text.as_str()) {
                *kind = TokenKind::Control;
            }
        }
        let ids = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut specials: Vec<u32> = (0..texts.len() as u32)
            .filter(|&i| {
                let k = kinds[i as usize];
                (k.is_special() || k == TokenKind::UserDefined) && !texts[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));
        Self {
            texts,
            scores,
            kinds,
            ids,
            merge_ranks,
            specials,
            bos: None,
            eos: None,
            unk: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the vocabulary has no tokens.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}
