//! A scan for non-finite weights (`--check-weights`): a NaN or an infinity in a weight
//! loads without complaint and turns every output into garbage, so an operator may ask for
//! every stored value to be decoded and checked before serving.

use crate::error::{Result, WeightsError};
use crate::quant;
use crate::WeightSource;

/// What a scan covered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FiniteScan {
    /// Tensors decoded and found finite.
    pub tensors: usize,
    /// Values checked.
    pub values: u64,
    /// Tensors of types with no decoder here (integer or fp8 tensors that no model layer
    /// reads as weights), by name and type.
    pub skipped: Vec<(String, String)>,
}

/// Decodes every tensor of `source` row by row and fails on the first NaN or infinity,
/// naming the tensor, the row and the column.
pub fn check_finite(source: &dyn WeightSource) -> Result<FiniteScan> {
    let mut scan = FiniteScan::default();
    let mut row = Vec::new();
    for name in source.names() {
        let Some(view) = source.get(name) else {
            continue;
        };
        if !quant::is_supported(view.ty) {
            scan.skipped.push((name.to_string(), view.ty.to_string()));
            continue;
        }
        row.resize(view.row_len(), 0.0f32);
        for r in 0..view.rows() {
            let Some(bytes) = view.row(r) else { break };
            quant::dequantize(view.ty, bytes, &mut row)?;
            if let Some(col) = row.iter().position(|v| !v.is_finite()) {
                return Err(WeightsError::Tensor {
                    name: name.to_string(),
                    reason: format!(
                        "row {r}, column {col} holds {} (a corrupt or badly converted file)",
                        row[col]
                    ),
                });
            }
            scan.values += row.len() as u64;
        }
        scan.tensors += 1;
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{write_safetensors, SafetensorsModel};

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn finite_weights_pass_and_a_nan_is_named() {
        let good = f32_bytes(&[1.0, -2.0, 0.5, 3.0]);
        let bad = f32_bytes(&[1.0, -2.0, 0.5, f32::NAN]);
        let bf16_inf = [0x80u8, 0x7f, 0, 0];
        let file = write_safetensors(&[("a", "F32", &[2, 2], &good)]);
        let model = SafetensorsModel::from_vec("ok", file).unwrap();
        let scan = check_finite(&model).unwrap();
        assert_eq!((scan.tensors, scan.values), (1, 4));
        let file = write_safetensors(&[("a", "F32", &[2, 2], &good), ("b", "F32", &[2, 2], &bad)]);
        let err = check_finite(&SafetensorsModel::from_vec("nan", file).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"b\"") && err.contains("row 1, column 1") && err.contains("NaN"),
            "{err}"
        );
        let file = write_safetensors(&[("c", "BF16", &[2], &bf16_inf)]);
        let err = check_finite(&SafetensorsModel::from_vec("inf", file).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"c\"") && err.contains("inf"), "{err}");
    }
}
