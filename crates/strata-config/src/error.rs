//! Why a configuration was refused.

/// A configuration the engine cannot read or cannot serve. Messages name the field (and the
/// layer, where one is involved) so a user knows what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    #[error("missing field `{0}`")]
    Missing(String),
    #[error("field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    #[error("field `{field}`: {reason} (not supported by Strata)")]
    Unsupported { field: String, reason: String },
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
