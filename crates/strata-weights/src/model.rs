//! Looking tensors up by HF name in either kind of file.

use std::path::Path;

use crate::error::{io_error, Result, WeightsError};
use crate::names::{Arch, NameMap};
use crate::{TensorView, WeightSource, Weights};

/// A weight file plus the name table of its architecture: every lookup takes the HF name
/// (with or without prefix), whatever the file format.
#[derive(Debug)]
pub struct ModelWeights {
    weights: Weights,
    names: NameMap,
    /// bitsandbytes 4-bit matrices, by stored name ([`ModelWeights::bnb4`]).
    bnb4: std::collections::BTreeMap<String, crate::bnb::Bnb4>,
}

impl ModelWeights {
    /// Pairs weights with a name table.
    pub fn new(weights: Weights, names: NameMap) -> Self {
        Self {
            weights,
            names,
            bnb4: Default::default(),
        }
    }

    /// As [`ModelWeights::new`], with a safetensors checkpoint's bitsandbytes 4-bit
    /// matrices read (their codes kept 4-bit: [`ModelWeights::bnb4`]).
    pub fn with_bnb(weights: Weights, names: NameMap) -> Result<Self> {
        let bnb4 = match &weights {
            Weights::Safetensors(s) => crate::bnb::read_all(s)?.into_iter().collect(),
            Weights::Gguf(_) => Default::default(),
        };
        Ok(Self {
            weights,
            names,
            bnb4,
        })
    }

    /// The bitsandbytes 4-bit matrix stored for an HF name (`get` has no view of one: its
    /// values are decoded where they are used).
    pub fn bnb4(&self, hf_name: &str) -> Option<&crate::bnb::Bnb4> {
        self.bnb4.get(&self.lookup(hf_name)?)
    }

    /// Opens `path` (see [`Weights::open`]). The architecture comes from `arch` if given,
    /// else from GGUF `general.architecture`, else from `model_type` in the `config.json`
    /// beside the safetensors files.
    pub fn open(
        path: impl AsRef<Path>,
        arch: Option<&str>,
        first_shared_layer: Option<usize>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let weights = Weights::open(path)?;
        let arch = match arch {
            Some(a) => a.to_string(),
            None => detect_arch(path, &weights)?,
        };
        Self::with_bnb(weights, NameMap::new(&arch, first_shared_layer)?)
    }

    /// The underlying weight file(s).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The HF <-> GGUF name table in use.
    pub fn names(&self) -> &NameMap {
        &self.names
    }

    /// The tensor stored for an HF name, or `None` (also for stale shared-layer tensors and
    /// tensors outside the text decoder).
    pub fn get(&self, hf_name: &str) -> Option<TensorView<'_>> {
        let stored = self.lookup(hf_name)?;
        if self.bnb4.contains_key(&stored) {
            return None;
        }
        self.weights.get(&stored)
    }

    /// The stored name the lookup of `hf_name` resolves to, if the tensor exists.
    fn lookup(&self, hf_name: &str) -> Option<String> {
        if self.names.is_stale_shared(hf_name) {
            return None;
        }
        match &self.weights {
            Weights::Gguf(_) => self.names.to_gguf(hf_name),
            Weights::Safetensors(s) => {
                let rest = self.names.strip_prefix(hf_name)?;
                if rest == "lm_head.weight" {
                    return ["lm_head.weight", "language_model.lm_head.weight"]
                        .into_iter()
                        .find(|n| s.get(n).is_some())
                        .map(str::to_string);
                }
                self.names
                    .arch()
                    .hf_prefixes()
                    .iter()
                    .map(|p| format!("{p}{rest}"))
                    .find(|n| s.get(n).is_some() || self.bnb4.contains_key(n))
            }
        }
    }

    /// The tensor for an HF name with exactly `expected` shape (HF order).
    pub fn require(&self, hf_name: &str, expected: &[usize]) -> Result<TensorView<'_>> {
        match self.get(hf_name) {
            Some(view) => view.expect_shape(expected),
            None => Err(WeightsError::Missing {
                name: self.describe(hf_name),
                expected: expected.to_vec(),
            }),
        }
    }

    /// Whether the output projection is the token embedding (no `lm_head` / `output` tensor).
    pub fn is_tied(&self) -> bool {
        self.get("lm_head.weight").is_none()
    }

    /// The output projection `[vocab, hidden]`: `lm_head.weight` / `output.weight` when
    /// stored, else the tied token embedding.
    pub fn lm_head(&self, expected: &[usize]) -> Result<TensorView<'_>> {
        match self.get("lm_head.weight") {
            Some(view) => view.expect_shape(expected),
            None => self.require("embed_tokens.weight", expected),
        }
    }

    fn describe(&self, hf_name: &str) -> String {
        match (&self.weights, self.names.to_gguf(hf_name)) {
            (Weights::Gguf(_), Some(g)) => format!("{g} (HF {hf_name})"),
            _ => hf_name.to_string(),
        }
    }
}

fn detect_arch(path: &Path, weights: &Weights) -> Result<String> {
    if let Weights::Gguf(g) = weights {
        return g
            .architecture()
            .map(str::to_string)
            .ok_or_else(|| WeightsError::UnknownArch("(no general.architecture)".into()));
    }
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    };
    let config = dir.join("config.json");
    let text = std::fs::read(&config).map_err(io_error(&config))?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| WeightsError::Io {
        path: config.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    // Multimodal configs name the wrapper; the decoder's type sits in text_config.
    let model_type = json
        .pointer("/text_config/model_type")
        .or_else(|| json.get("model_type"))
        .and_then(|v| v.as_str())
        .unwrap_or("");
    match Arch::from_name(model_type) {
        Some(a) => Ok(a.name().to_string()),
        None => Err(WeightsError::UnknownArch(model_type.to_string())),
    }
}
