//! Finding and reading a model's configuration on disk.

use std::path::{Path, PathBuf};

use crate::{gguf, hf, ConfigError, ModelConfig};

/// Where a model lives on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face model: the directory holding `config.json` (and its weights).
    HuggingFace {
        /// The model directory.
        dir: PathBuf,
        /// Its `config.json`.
        config: PathBuf,
    },
    /// A single GGUF file.
    Gguf(PathBuf),
}

impl ModelSource {
    /// Classifies a path: a `.gguf` file, a `config.json`, or a directory holding one.
    pub fn locate(path: &Path) -> Result<Self, ConfigError> {
        let io = |e| ConfigError::Io {
            path: path.display().to_string(),
            source: e,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            let config = path.join("config.json");
            if config.is_file() {
                return Ok(Self::HuggingFace {
                    dir: path.to_path_buf(),
                    config,
                });
            }
            let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                .collect();
            return match ggufs.as_slice() {
                [one] => Ok(Self::Gguf(one.clone())),
                [] => Err(ConfigError::Missing(format!(
                    "config.json or a .gguf file in {}",
                    path.display()
                ))),
                _ => Err(ConfigError::invalid(
                    path.display().to_string(),
                    "holds several .gguf files; name the one to load",
                )),
            };
        }
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && magic == *b"GGUF";
        if is_gguf || path.extension().is_some_and(|e| e == "gguf") {
            return Ok(Self::Gguf(path.to_path_buf()));
        }
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(Self::HuggingFace {
            dir,
            config: path.to_path_buf(),
        })
    }
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json` document.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        crate::validate::validate(hf::parse(text)?)
    }

    /// Reads the configuration from a parsed GGUF file's metadata.
    pub fn from_gguf(file: &strata_gguf::GgufFile) -> Result<Self, ConfigError> {
        crate::validate::validate(gguf::parse(file)?)
    }
}

/// Loads the configuration of the model at `path` (a `config.json`, a model directory or a
/// `.gguf` file).
pub fn load_model_config(path: &Path) -> Result<(ModelConfig, ModelSource), ConfigError> {
    let source = ModelSource::locate(path)?;
    let config = match &source {
        ModelSource::HuggingFace { config, .. } => {
            ModelConfig::from_hf_json(&read_config_json(config)?)?
        }
        ModelSource::Gguf(p) => ModelConfig::from_gguf(&strata_gguf::GgufFile::open(p)?)?,
    };
    Ok((config, source))
}

/// The text of `config.json`: `path` itself, or the one inside `path` when it is a directory.
pub(crate) fn read_config_json(path: &Path) -> Result<String, ConfigError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    std::fs::read_to_string(&file).map_err(|e| ConfigError::Io {
        path: file.display().to_string(),
        source: e,
    })
}
