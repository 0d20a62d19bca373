//! `tokenizer.json` models through the `tokenizers` crate.

use std::path::Path;

use serde_json::Value;

use crate::{bpe, spm, TokenizerError};

/// How token strings map back to bytes, from the `decoder` section of `tokenizer.json`.
enum Spelling {
    ByteLevel,
    SentencePiece,
}

pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens' texts treated as plain text (for
    /// `parse_special = false`).
    literal: tokenizers::Tokenizer,
    spelling: Spelling,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
}

fn read(path: &Path) -> Result<Option<String>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TokenizerError::Io {
            path: path.display().to_string(),
            source: e,
        }),
    }
}

/// A special-token entry of tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl HfTokenizer {
    pub fn load(dir: &Path) -> Result<(Self, Option<String>), TokenizerError> {
        let json_path = dir.join("tokenizer.json");
        let json = read(&json_path)?.ok_or_else(|| TokenizerError::Io {
            path: json_path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TokenizerError::Hf(e.to_string()))?;
        let mut literal = inner.clone();
        literal.set_encode_special_tokens(true);
        let raw: Value =
            serde_json::from_str(&json).map_err(|e| TokenizerError::Hf(e.to_string()))?;
        let decoder = raw.get("decoder").map(Value::to_string).unwrap_or_default();
        let spelling = if decoder.contains("ByteLevel") {
            Spelling::ByteLevel
        } else {
            Spelling::SentencePiece
        };
        let config: Value = match read(&dir.join("tokenizer_config.json"))? {
            Some(s) => serde_json::from_str(&s)
                .map_err(|e| TokenizerError::Hf(format!("tokenizer_config.json: {e}")))?,
            None => Value::Null,
        };
        let id_of = |key: &str| token_text(config.get(key)).and_then(|t| inner.token_to_id(&t));
        let bos = id_of("bos_token");
        let eos = id_of("eos_token");
        let add_bos = config
            .get("add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            && bos.is_some();
        let template = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(items)) => items
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string),
            _ => read(&dir.join("chat_template.jinja"))?,
        };
        Ok((
            Self {
                inner,
                literal,
                spelling,
                bos,
                eos,
                add_bos,
            },
            template,
        ))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The texts of the special added tokens (`special: true` in `tokenizer.json`).
    pub fn special_texts(&self) -> Vec<String> {
        self.inner
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect()
    }

    /// `tokenizer.json` post-processors decide special tokens for `add_special`; special
    /// tokens written in the text become their ids only with `parse_special`.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let tok = if parse_special {
            &self.inner
        } else {
            &self.literal
        };
        let mut ids = tok
            .encode(text, add_special)
            .map_err(|e| TokenizerError::Input(e.to_string()))?
            .get_ids()
            .to_vec();
        if add_special && self.add_bos && ids.first() != self.bos.as_ref() {
            ids.insert(0, self.bos.unwrap_or_default());
        }
        Ok(ids)
    }

    pub fn token_bytes(&self, id: u32, with_special: bool) -> Result<Vec<u8>, TokenizerError> {
        let text = self
            .inner
            .id_to_token(id)
            .ok_or(TokenizerError::UnknownId(id))?;
        let special = self
            .inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special);
        if special {
            return Ok(if with_special {
                text.into_bytes()
            } else {
                Vec::new()
            });
        }
        Ok(match self.spelling {
            Spelling::ByteLevel => bpe::decode_bytes(&text),
            Spelling::SentencePiece => spm::piece_bytes(&text),
        })
    }
}
