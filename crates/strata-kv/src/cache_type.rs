//! `--cache-type`: whether finished prefixes are kept for reuse.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::KvError;

/// The `--cache-type` choice: whether finished prefixes are kept for reuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheType {
    /// Radix prefix cache: requests reuse the K/V of cached prefixes.
    #[default]
    Radix,
    /// No reuse: every request computes its whole prompt.
    Naive,
}

impl CacheType {
    /// The canonical spelling, as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            CacheType::Radix => "radix",
            CacheType::Naive => "naive",
        }
    }
}

impl FromStr for CacheType {
    type Err = KvError;

    fn from_str(s: &str) -> Result<Self, KvError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "radix" => Ok(CacheType::Radix),
            "naive" => Ok(CacheType::Naive),
            _ => Err(KvError::UnknownCacheType(s.to_string())),
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
