//! Why a configuration was refused.

/// A configuration the engine cannot read or cannot serve. Messages name the field (and the
/// layer, where one is involved) so a user knows what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file's path, as given.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON.
    #[error("config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// A required field is absent; holds its name.
    #[error("missing field `{0}`")]
    Missing(String),
    /// A value out of its range or inconsistent with another field.
    #[error("field `{field}`: {reason}")]
    Invalid {
        /// The field, as named in the configuration (e.g. `layer_types[3]`).
        field: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// A valid value the engine does not serve.
    #[error("field `{field}`: {reason} (not supported by Strata)")]
    Unsupported {
        /// The field, as named in the configuration (e.g. `layer_types[3]`).
        field: String,
        /// What the engine does not serve.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Unsupported {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
