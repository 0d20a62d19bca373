//! GGUF quantized block formats: layouts, dequantization, dot products and (for the formats
//! the engine writes itself) quantization.
//!
//! Every block struct is `#[repr(C)]`, has alignment 1 and no padding, so a tensor's raw
//! bytes can be reinterpreted as `&[Block]` wherever they sit in a memory map
//! ([`as_blocks`]). Half-precision fields are kept as little-endian bytes ([`F16Le`]) for the
//! same reason.
//!
//! Numerics: dequantization performs the same f32 operations in the same order as gguf-py's
//! numpy reference (`gguf.quants`), so it is bit-exact with it (tested against committed
//! vectors). Dot products against f32 accumulate in f32 per block and are checked against the
//! dequantized values within a tolerance. Dot products against quantized activations
//! ([`QuantBlock::dot_q8`]) use integer sums per sub-block, the way a fast CPU kernel does.

mod block32;
mod f16le;
mod fast;
mod float;
mod k_common;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_acts;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_acts;
#[cfg(target_arch = "x86_64")]
mod x86_b32;
#[cfg(target_arch = "x86_64")]
mod x86_k;

pub use f16le::F16Le;
pub use fast::{dot_rows_q8, dot_rows_q8_portable, has_q8_path, q8_family, Q8Input};
pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16};
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_k::BlockQ8K;

use crate::error::{Result, WeightsError};
use strata_gguf::GgmlType;

/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;

/// One block of a quantized GGUF format.
pub trait QuantBlock: bytemuck::Pod {
    /// The GGUF type this block belongs to.
    const TYPE: GgmlType;
    /// Elements per block.
    const ELEMS: usize;
    /// The quantized activation block this format's integer dot product pairs with
    /// ([`BlockQ8_0`] for the 32-element formats, [`BlockQ8K`] for the K-quants).
    type Activation: ActivationBlock;

    /// Writes the block's `ELEMS` values to `out[..ELEMS]`.
    fn dequantize(&self, out: &mut [f32]);

    /// `sum(w[i] * x[i])` over the block; `x` holds `ELEMS` values.
    fn dot(&self, x: &[f32]) -> f32;

    /// The same dot product against an activation block covering the same elements.
    fn dot_q8(&self, a: &Self::Activation) -> f32;
}

/// An 8-bit activation block ([`BlockQ8_0`] or [`BlockQ8K`]).
pub trait ActivationBlock: bytemuck::Pod {
    /// Elements per block.
    const ELEMS: usize;
    /// Quantizes `x` (exactly `ELEMS` values) into one block.
    fn quantize(x: &[f32]) -> Self;
}

/// Reinterprets raw tensor bytes as blocks without copying.
pub fn as_blocks<B: QuantBlock>(bytes: &[u8]) -> Result<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(WeightsError::Length {
            what: "quantized data is not a whole number of blocks",
            expected: bytes.len().next_multiple_of(size),
            found: bytes.len(),
        });
    }
    // Alignment 1 and a length that is a multiple of the size: this cannot fail.
    Ok(bytemuck::cast_slice(bytes))
}

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(WeightsError::Length {
            what,
            expected,
            found,
        })
    }
}

/// Dequantizes a row of blocks into `out`, which must hold `blocks.len() * B::ELEMS` values.
pub fn dequantize_row<B: QuantBlock>(blocks: &[B], out: &mut [f32]) -> Result<()> {
    check_len("dequantize output", blocks.len() * B::ELEMS, out.len())?;
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
        b.dequantize(o);
    }
    Ok(())
}

/// Dot product of a row of blocks with f32 values (`blocks.len() * B::ELEMS` of them).
pub fn dot<B: QuantBlock>(blocks: &[B], x: &[f32]) -> Result<f32> {
    check_len("dot activations", blocks.len() * B::ELEMS, x.len())?;
    Ok(blocks
        .iter()
        .zip(x.chunks_exact(B::ELEMS))
        .map(|(b, x)| b.dot(x))
        .sum())
}

/// Quantizes activations for [`dot_q8`]; `x.len()` must be a multiple of the block size.
pub fn quantize_activations<A: ActivationBlock>(x: &[f32]) -> Result<Vec<A>> {
    check_len(
        "activations to quantize",
        x.len().next_multiple_of(A::ELEMS),
        x.len(),
    )?;
    Ok(x.chunks_exact(A::ELEMS).map(A::quantize).collect())
}

/// Dot product of a row of weight blocks with quantized activations covering the same elements.
pub fn dot_q8<B: QuantBlock>(blocks: &[B], acts: &[B::Activation]) -> Result<f32> {
    check_len(
        "quantized activations (elements)",
        blocks.len() * B::ELEMS,
        acts.len() * <B::Activation as ActivationBlock>::ELEMS,
    )?;
    let per = B::ELEMS / <B::Activation as ActivationBlock>::ELEMS;
    debug_assert_eq!(
        per, 1,
        "every weight block pairs with exactly one activation block"
    );
    Ok(blocks.iter().zip(acts).map(|(b, a)| b.dot_q8(a)).sum())
}

/// Calls `$body` with `$B` bound to the block type of a quantized `GgmlType`.
macro_rules! with_block_type {
    ($ty:expr, $B:ident => $body:expr, $other:ident => $fallback:expr) => {
        match $ty {
            GgmlType::Q4_0 => {
                type $B = BlockQ4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $B = BlockQ4_1;
                $body
            }
            GgmlType::Q5_0 => {
                type $B = BlockQ5_0;
                $body
            }
            GgmlType::Q5_1 => {
                type $B = BlockQ5_1;
                $body
            }
            GgmlType::Q8_0 => {
                type $B = BlockQ8_0;
                $body
            }
            GgmlType::Q2_K => {
                type $B = BlockQ2K;
                $body
            }
            GgmlType::Q3_K => {
                type $B = BlockQ3K;
                $body
            }
            GgmlType::Q4_K => {
                type $B = BlockQ4K;
                $body
            }
            GgmlType::Q5_K => {
                type $B = BlockQ5K;
                $body
            }
            GgmlType::Q6_K => {
                type $B = BlockQ6K;
                $body
            }
            $other => $fallback,
        }
    };
}

/// The tensor types this crate can decode.
pub const SUPPORTED_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Whether [`dequantize`] and [`dot_bytes`] handle `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED_TYPES.contains(&ty)
}

/// Dequantizes raw data of type `ty` into `out` (one f32 per element).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    with_block_type!(ty, B => dequantize_row(as_blocks::<B>(bytes)?, out), other => {
        match other {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::decode(other, bytes, out),
            _ => Err(WeightsError::UnsupportedType(other)),
        }
    })
}

/// Dot product of raw data of type `ty` (one row or several, flattened) with `x`.
pub fn dot_bytes(ty: GgmlType, bytes: &[u8], x: &[f32]) -> Result<f32> {
    with_block_type!(ty, B => dot(as_blocks::<B>(bytes)?, x), other => {
        match other {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::dot(other, bytes, x),
            _ => Err(WeightsError::UnsupportedType(other)),
        }
    })
}

#[cfg(test)]
mod tests;
