//! A borrowed, typed view of one tensor's bytes.

use crate::error::{Result, WeightsError};
use crate::quant;
use strata_gguf::GgmlType;

/// One tensor as stored: name, shape in HF order (outermost first), element type and the
/// raw little-endian bytes, borrowed from the memory map.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    /// The tensor's name in its file.
    pub name: &'a str,
    /// Outermost first: a linear layer is `[out_features, in_features]`.
    pub shape: Vec<usize>,
    /// How the elements are stored.
    pub ty: GgmlType,
    /// The raw little-endian bytes.
    pub bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Number of elements. (Sources check that this fits; a zero-length axis makes it 0
    /// even when the other axes alone would overflow, so the zero is tested first.)
    pub fn elements(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// Length of the innermost (contiguous) axis; 1 for a scalar.
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows (product of all but the innermost axis). Saturates: a tensor with a
    /// zero-length axis can have outer axes whose product overflows.
    pub fn rows(&self) -> usize {
        let n = self.shape.len().saturating_sub(1);
        self.shape[..n]
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.bytes.len() / self.rows().max(1)
    }

    /// The bytes of row `i`, or `None` past the end.
    pub fn row(&self, i: usize) -> Option<&'a [u8]> {
        let n = self.row_bytes();
        self.bytes
            .get(i.checked_mul(n)?..i.checked_add(1)?.checked_mul(n)?)
    }

    /// The data as `&[f32]` without copying, when the type is F32 and the bytes happen to be
    /// 4-byte aligned (true for GGUF tensors and for safetensors files with the usual
    /// 8-byte-padded header).
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        if self.ty != GgmlType::F32 || cfg!(target_endian = "big") {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes).ok()
    }

    /// The data as `&[half::f16]` without copying (F16, 2-byte aligned).
    pub fn as_f16(&self) -> Option<&'a [half::f16]> {
        if self.ty != GgmlType::F16 || cfg!(target_endian = "big") {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes).ok()
    }

    /// The data as `&[half::bf16]` without copying (BF16, 2-byte aligned).
    pub fn as_bf16(&self) -> Option<&'a [half::bf16]> {
        if self.ty != GgmlType::BF16 || cfg!(target_endian = "big") {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes).ok()
    }

    /// Decodes the whole tensor to f32.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.elements()];
        self.dequantize_into(&mut out)?;
        Ok(out)
    }

    /// Decodes the whole tensor into `out` (`elements()` values).
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<()> {
        quant::dequantize(self.ty, self.bytes, out).map_err(|e| self.wrap(e))
    }

    /// Dot product of row `i` with `x` (`row_len()` values).
    pub fn dot_row(&self, i: usize, x: &[f32]) -> Result<f32> {
        let row = self.row(i).ok_or_else(|| WeightsError::Tensor {
            name: self.name.to_string(),
            reason: format!("row {i} out of range ({} rows)", self.rows()),
        })?;
        quant::dot_bytes(self.ty, row, x).map_err(|e| self.wrap(e))
    }

    /// Checks the shape, giving the "expected vs found" error.
    pub fn expect_shape(self, expected: &[usize]) -> Result<Self> {
        if self.shape == expected {
            Ok(self)
        } else {
            Err(WeightsError::Shape {
                name: self.name.to_string(),
                expected: expected.to_vec(),
                found: self.shape,
            })
        }
    }

    fn wrap(&self, e: WeightsError) -> WeightsError {
        WeightsError::Tensor {
            name: self.name.to_string(),
            reason: e.to_string(),
        }
    }
}
