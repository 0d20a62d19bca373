//! Tokenizers for every model Strata serves, behind one `Tokenizer` type.

mod bpe;
mod chat;
mod hf;
mod special;
mod spm;
mod spm_merges;
mod stream;
mod vocab;

use std::path::Path;

pub use chat::{ChatMessage, ChatOptions, ChatPart, ChatTemplate, GEMMA_TEMPLATE};
pub use stream::StreamDecoder;
pub use vocab::{TokenKind, Vocab};

use special::Fragment;
use strata_gguf::{GgufFile, Value};

/// Why a tokenizer could not be loaded or could not encode, decode or render.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Malformed tokenizer data: GGUF tokenizer keys out of shape or out of range, or a
    /// pre-tokenizer regex that does not compile.
    #[error("invalid tokenizer data: {0}")]
    Invalid(String),
    /// A tokenizer model or pre-tokenizer Strata does not implement.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file's path.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `tokenizer.json` or `tokenizer_config.json` could not be loaded.
    #[error("tokenizer.json: {0}")]
    Hf(String),
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),
    /// A token id past the end of the vocabulary.
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
    /// The text itself cannot be tokenized (the caller's input, not the tokenizer's data).
    #[error("cannot tokenize the text: {0}")]
    Input(String),
}

enum Algorithm {
    /// SentencePiece-style merging by score (GGUF `llama`).
    Spm,
    /// Byte-level BPE (GGUF `gpt2`).
    Bpe(bpe::PreTokenizer),
    /// Ranked merges over SentencePiece-style text (GGUF `gemma4`).
    SpmMerges,
}

// One per loaded model: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Gguf { vocab: Vocab, algorithm: Algorithm },
    Hf(hf::HfTokenizer),
}

/// Text <-> ids for one model.
pub struct Tokenizer {
    backend: Backend,
    chat_template: Option<String>,
    /// Finds control-token texts in a message; built on first use.
    controls: std::sync::OnceLock<Option<aho_corasick::AhoCorasick>>,
}

impl Tokenizer {
    /// The vocabulary embedded in a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let vocab = Vocab::from_gguf(file)?;
        let model = file
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("llama");
        let algorithm = match model {
            "llama" => Algorithm::Spm,
            "gpt2" => {
                let pre = file
                    .get("tokenizer.ggml.pre")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                Algorithm::Bpe(bpe::PreTokenizer::named(pre)?)
            }
            "gemma4" => {
                if vocab.merge_ranks.is_empty() {
                    return Err(TokenizerError::Invalid(
                        "tokenizer.ggml.model = \"gemma4\" needs tokenizer.ggml.merges".into(),
                    ));
                }
                Algorithm::SpmMerges
            }
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.model = {other:?} (Strata reads \"llama\", \"gpt2\" and \"gemma4\")"
                )))
            }
        };
        let chat_template = file
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Self {
            backend: Backend::Gguf { vocab, algorithm },
            chat_template,
            controls: Default::default(),
        })
    }

    /// A Hugging Face model directory: `tokenizer.json` plus `tokenizer_config.json` (special
    /// tokens, BOS policy, chat template) when present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let (tok, chat_template) = hf::HfTokenizer::load(dir)?;
        Ok(Self {
            backend: Backend::Hf(tok),
            chat_template,
            controls: Default::default(),
        })
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab.len(),
            Backend::Hf(t) => t.vocab_size(),
        }
    }

    /// The beginning-of-sequence token id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab.bos,
            Backend::Hf(t) => t.bos,
        }
    }

    /// The end-of-sequence token id, if the tokenizer has one.
    pub fn eos_id(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab.eos,
            Backend::Hf(t) => t.eos,
        }
    }

    /// Whether `encode(.., add_special = true)` starts with BOS.
    pub fn adds_bos(&self) -> bool {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab.add_bos && vocab.bos.is_some(),
            Backend::Hf(t) => t.add_bos,
        }
    }

    /// The id of a token by its exact text (e.g. `"<end_of_turn>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab.ids.get(text).copied(),
            Backend::Hf(t) => t.token_id(text),
        }
    }

    /// The texts that `encode(.., parse_special = true)` turns into control tokens
    /// (`<start_of_turn>`, `<|im_end|>`).
    fn control_texts(&self) -> Vec<String> {
        match &self.backend {
            Backend::Gguf { vocab, .. } => vocab
                .specials
                .iter()
                .filter(|&&id| vocab.kinds[id as usize].is_special())
                .map(|&id| vocab.texts[id as usize].clone())
                .filter(|t| !t.is_empty())
                .collect(),
            Backend::Hf(t) => t.special_texts(),
        }
    }

    /// Where control-token texts occur in `text` (leftmost, longest first), as byte ranges:
    /// what `parse_special` would turn into control tokens.
    pub fn control_spans(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        let matcher = self.controls.get_or_init(|| {
            aho_corasick::AhoCorasick::builder()
                .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                .build(self.control_texts())
                .ok()
        });
        match matcher {
            Some(m) => m.find_iter(text).map(|m| m.range()).collect(),
            None => Vec::new(),
        }
    }

    /// Tokenizes text made of pieces of two kinds: markup, whose control-token texts
    /// become control tokens, and literal text (a user's message), whose control-token
    /// texts stay text. `add_special` applies to the whole: BOS before the first piece.
    pub fn encode_pieces(
        &self,
        pieces: &[(&str, bool)],
        add_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        let mut first = add_special;
        for &(text, literal) in pieces.iter().filter(|(t, _)| !t.is_empty()) {
            out.extend(self.encode(text, first, !literal)?);
            first = false;
        }
        Ok(out)
    }

    /// The model's Jinja chat template, if its files carry one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Tokenizes `text`. `add_special` adds BOS (and EOS) as the model is configured to;
    /// `parse_special` lets control tokens written in the text (`<start_of_turn>`) become
    /// their ids rather than being spelled out.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        match &self.backend {
            Backend::Hf(t) => t.encode(text, add_special, parse_special),
            Backend::Gguf { vocab, algorithm } => {
                let mut out = Vec::with_capacity(text.len() / 3 + 2);
                if add_special && vocab.add_bos {
                    out.extend(vocab.bos);
                }
                let mut first = true;
                for frag in special::partition(vocab, text, parse_special) {
                    match frag {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => match algorithm {
                            Algorithm::Spm => {
                                let mut s = String::with_capacity(t.len() + 3);
                                if vocab.add_space_prefix && first {
                                    s.push(' ');
                                }
                                s.push_str(t);
                                spm::encode(vocab, &spm::escape_whitespace(&s), &mut out);
                            }
                            Algorithm::Bpe(pre) => {
                                for piece in pre.split(t)? {
                                    bpe::encode_piece(vocab, piece, &mut out);
                                }
                            }
                            Algorithm::SpmMerges => spm_merges::encode(vocab, t, &mut out),
                        },
                    }
                    first = false;
                }
                if add_special && vocab.add_eos {
                    out.extend(vocab.eos);
                }
                Ok(out)
            }
        }
    }

    /// The bytes of one token as it appears in decoded text. Special tokens give nothing
    /// unless `with_special`.
    pub fn token_bytes(&self, id: u32, with_special: bool) -> Result<Vec<u8>, TokenizerError> {
        match &self.backend {
            Backend::Hf(t) => t.token_bytes(id, with_special),
            Backend::Gguf { vocab, algorithm } => {
                let i = id as usize;
                let text = vocab.texts.get(i).ok_or(TokenizerError::UnknownId(id))?;
                Ok(match vocab.kinds[i] {
                    k if k.is_special() => {
                        if with_special {
                            text.clone().into_bytes()
                        } else {
                            Vec::new()
                        }
                    }
                    TokenKind::UserDefined => text.clone().into_bytes(),
                    TokenKind::Byte => spm::piece_bytes(text),
                    _ => match algorithm {
                        Algorithm::Spm | Algorithm::SpmMerges => spm::piece_bytes(text),
                        Algorithm::Bpe(_) => bpe::decode_bytes(text),
                    },
                })
            }
        }
    }

    /// Decodes ids to text; bytes that do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], with_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend(self.token_bytes(id, with_special)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
