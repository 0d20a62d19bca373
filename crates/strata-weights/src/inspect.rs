//! A summary of a weight file for `strata inspect`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::{WeightSource, Weights};

/// What `strata inspect` prints about the weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsSummary {
    /// `"gguf"` or `"safetensors"`.
    pub format: &'static str,
    /// Number of tensors in the file(s).
    pub tensor_count: usize,
    /// Tensor type name (`"Q4_K"`, `"BF16"`, ...) -> number of tensors.
    pub types: BTreeMap<String, usize>,
    /// Total number of elements over all tensors.
    pub parameters: u64,
}

/// Summarises a GGUF file, a safetensors file or a model directory (see [`Weights::open`]).
pub fn inspect(path: impl AsRef<Path>) -> Result<WeightsSummary> {
    Ok(summarize(&Weights::open(path)?))
}

/// Summarises an open source. Safetensors tensors of dtypes this crate does not serve are
/// still counted, under their safetensors dtype name.
pub fn summarize(weights: &Weights) -> WeightsSummary {
    let mut types = BTreeMap::new();
    let mut parameters = 0u64;
    let names = weights.names();
    for name in &names {
        let (ty, elements) = match (weights.get(name), weights) {
            (Some(v), _) => (v.ty.name().to_string(), v.elements() as u64),
            (None, Weights::Safetensors(s)) => (
                s.dtype(name).unwrap_or("?").to_string(),
                s.shape(name)
                    .map_or(0, |d| d.iter().product::<usize>() as u64),
            ),
            (None, Weights::Gguf(_)) => continue,
        };
        *types.entry(ty).or_insert(0) += 1;
        parameters += elements;
    }
    WeightsSummary {
        format: weights.format(),
        tensor_count: names.len(),
        types,
        parameters,
    }
}
