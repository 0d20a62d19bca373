//! The common interface of the two file formats.

use std::path::Path;

use crate::error::{io_error, Result, WeightsError};
use crate::{GgufModel, SafetensorsModel, TensorView};

/// Something that hands out tensors by their stored name.
pub trait WeightSource {
    /// The tensor with this exact stored name.
    fn get(&self, name: &str) -> Option<TensorView<'_>>;

    /// All stored tensor names (file order for GGUF, sorted for safetensors).
    fn names(&self) -> Vec<&str>;

    /// `"gguf"` or `"safetensors"`.
    fn format(&self) -> &'static str;

    /// The tensor, which must exist and have exactly `expected` shape (HF order).
    fn require(&self, name: &str, expected: &[usize]) -> Result<TensorView<'_>> {
        match self.get(name) {
            Some(view) => view.expect_shape(expected),
            None => Err(WeightsError::Missing {
                name: name.to_string(),
                expected: expected.to_vec(),
            }),
        }
    }
}

/// Either kind of weight file.
#[derive(Debug)]
pub enum Weights {
    /// Safetensors file(s): one file or a sharded index.
    Safetensors(SafetensorsModel),
    /// A GGUF file.
    Gguf(GgufModel),
}

impl Weights {
    /// Opens a `.gguf` file, a `.safetensors` file, or a model directory (sharded index,
    /// `model.safetensors`, or a directory holding exactly one `.gguf` file).
    /// Files are recognised by content (GGUF magic), not only by extension.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            if path.join("model.safetensors.index.json").is_file()
                || path.join("model.safetensors").is_file()
            {
                return SafetensorsModel::open_dir(path).map(Weights::Safetensors);
            }
            let ggufs: Vec<_> = std::fs::read_dir(path)
                .map_err(io_error(path))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
                .collect();
            return match ggufs.as_slice() {
                [one] => GgufModel::open(one).map(Weights::Gguf),
                _ => Err(WeightsError::NoWeights(path.display().to_string())),
            };
        }
        let mut magic = [0u8; 4];
        let is_gguf = {
            use std::io::Read;
            let mut f = std::fs::File::open(path).map_err(io_error(path))?;
            f.read_exact(&mut magic).is_ok() && magic == *b"GGUF"
        };
        if is_gguf {
            GgufModel::open(path).map(Weights::Gguf)
        } else {
            SafetensorsModel::open(path).map(Weights::Safetensors)
        }
    }

    fn inner(&self) -> &dyn WeightSource {
        match self {
            Weights::Safetensors(s) => s,
            Weights::Gguf(g) => g,
        }
    }
}

impl WeightSource for Weights {
    fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.inner().get(name)
    }
    fn names(&self) -> Vec<&str> {
        self.inner().names()
    }
    fn format(&self) -> &'static str {
        self.inner().format()
    }
}
