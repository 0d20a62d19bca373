//! GGUF files as a [`WeightSource`].

use std::path::Path;

use strata_gguf::{GgufFile, TensorInfo, Value};

use crate::error::Result;
use crate::{TensorView, WeightSource};

/// A memory-mapped GGUF file. Tensor shapes are reported in HF order (GGUF's innermost-first
/// dims reversed); bytes are untouched.
#[derive(Debug)]
pub struct GgufModel {
    file: GgufFile,
}

impl GgufModel {
    /// Memory-maps and parses a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self {
            file: GgufFile::open(path)?,
        })
    }

    /// Parses an in-memory file.
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self> {
        Ok(Self {
            file: GgufFile::from_vec(bytes)?,
        })
    }

    /// The container: metadata (every GGUF value type), alignment, tensor directory.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.file.architecture()
    }

    /// One metadata value.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.file.get(key)
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        TensorView {
            name: &info.name,
            // Dims were checked at parse time to have a product that fits in u64, and so
            // in usize on the 64-bit targets this engine runs on.
            shape: info.dims.iter().rev().map(|&d| d as usize).collect(),
            ty: info.ggml_type,
            bytes: self.file.tensor_data(info),
        }
    }
}

impl WeightSource for GgufModel {
    fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.file.tensor(name).map(|info| self.view(info))
    }

    fn names(&self) -> Vec<&str> {
        self.file
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect()
    }

    fn format(&self) -> &'static str {
        "gguf"
    }
}
