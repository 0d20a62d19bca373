//! Test helpers: a `safetensors` file of reference tensors written by transformers (the
//! towers' inputs and outputs), read by name, and the cosine the GPU checks report.

/// A reference file's bytes.
pub(crate) struct Reference(Vec<u8>);

impl Reference {
    /// `dir/reference.safetensors`.
    pub(crate) fn load(dir: &std::path::Path) -> Self {
        Self::file(&dir.join("reference.safetensors"))
    }

    /// Any reference file.
    pub(crate) fn file(path: &std::path::Path) -> Self {
        Self(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    /// Tensor `name`'s bytes; `None` when the file has no such tensor.
    pub(crate) fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        let st = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        st.tensor(name).ok().map(|t| t.data().to_vec())
    }

    /// Tensor `name` as f32 values (panics when it is missing).
    pub(crate) fn f32s(&self, name: &str) -> Vec<f32> {
        self.bytes(name)
            .unwrap_or_else(|| panic!("{name} is not in the reference"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// The cosine of two vectors, in f64.
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum::<f64>()
    };
    dot(a, b) / (dot(a, a).sqrt() * dot(b, b).sqrt())
}
