//! Weights quantized at load (`LoadOptions::quantize`, `--quantize`): a dense checkpoint's
//! matrices converted to a GGUF block format as they are read, so a safetensors model runs
//! with the memory and the weight reads of a quantized file. The blocks are the host
//! quantizers' of `strata-weights` (Q8_0, Q6_K, Q4_K), the same a GGUF file would hold.

use strata_weights::quant::{self, BlockQ4K, BlockQ6K, BlockQ8_0};
use strata_weights::{GgmlType, TensorView};

use crate::error::{ModelError, Result};
use crate::linear::QuantWeight;

/// The formats a dense matrix can be quantized to at load.
pub const LOAD_QUANT_TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q4_K];

/// `view` quantized to `to`, or `None` where it stays as stored: no format asked, a stored
/// block format, or rows that are not whole blocks.
pub fn at_load(view: &TensorView<'_>, to: Option<GgmlType>) -> Result<Option<QuantWeight>> {
    let Some(to) = to else { return Ok(None) };
    let dense = !crate::linear::is_block_format(view.ty);
    let block = to.block_size() as usize;
    let (rows, cols) = (view.rows(), view.row_len());
    if !dense || rows < 2 || cols == 0 || !cols.is_multiple_of(block) {
        return Ok(None);
    }
    let x = view.to_f32_vec()?;
    let row_bytes = cols / block * to.type_size() as usize;
    let mut bytes = vec![0u8; rows * row_bytes];
    // Rows are independent: one share of them per core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads);
    let result: Result<()> = std::thread::scope(|s| {
        let jobs: Vec<_> = bytes
            .chunks_mut(per * row_bytes)
            .zip(x.chunks(per * cols))
            .map(|(out, x)| s.spawn(move || quantize_rows(to, x, out, cols, row_bytes)))
            .collect();
        for j in jobs {
            j.join()
                .map_err(|_| ModelError::Invalid("a quantizing thread panicked".into()))??;
        }
        Ok(())
    });
    result.map_err(|e| {
        ModelError::Invalid(format!("{}: quantizing to {}: {e}", view.name, to.name()))
    })?;
    Ok(Some(QuantWeight::from_blocks(to, rows, cols, bytes)))
}

fn quantize_rows(
    to: GgmlType,
    x: &[f32],
    out: &mut [u8],
    cols: usize,
    row_bytes: usize,
) -> Result<()> {
    for (x, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
        let r = match to {
            GgmlType::Q8_0 => {
                quant::q8_0::quantize_row(x, bytemuck::cast_slice_mut::<u8, BlockQ8_0>(out))
            }
            GgmlType::Q6_K => {
                quant::q6_k::quantize_row(x, bytemuck::cast_slice_mut::<u8, BlockQ6K>(out))
            }
            GgmlType::Q4_K => {
                quant::q4_k::quantize_row(x, bytemuck::cast_slice_mut::<u8, BlockQ4K>(out))
            }
            other => {
                return Err(ModelError::Invalid(format!(
                    "{} is not a format weights are quantized to at load",
                    other.name()
                )))
            }
        };
        r.map_err(|e| ModelError::Invalid(e.to_string()))?;
    }
    Ok(())
}
