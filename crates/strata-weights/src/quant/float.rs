//! The unquantized GGUF/safetensors types: F32, F16, BF16.

use crate::error::{Result, WeightsError};
use strata_gguf::GgmlType;

/// Decodes one little-endian f16.
pub fn f16_to_f32(bytes: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bytes)).to_f32()
}

/// Decodes one little-endian bf16 (the top half of an f32; exact).
pub fn bf16_to_f32(bytes: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(bytes)) << 16)
}

/// fp32 -> bf16 with round-to-nearest-even; NaNs become quiet NaNs (as ggml and gguf-py do).
pub fn f32_to_bf16(v: f32) -> [u8; 2] {
    let bits = v.to_bits();
    let out = if bits & 0x7fff_ffff > 0x7f80_0000 {
        ((bits & 0xffff_0000) | (64 << 16)) >> 16
    } else {
        ((u64::from(bits) + 0x7fff + u64::from((bits >> 16) & 1)) >> 16) as u32
    };
    (out as u16).to_le_bytes()
}

fn elem_size(ty: GgmlType) -> usize {
    if ty == GgmlType::F32 {
        4
    } else {
        2
    }
}

pub(super) fn decode(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let size = elem_size(ty);
    if bytes.len() != out.len() * size {
        return Err(WeightsError::Length {
            what: "dequantize input",
            expected: out.len() * size,
            found: bytes.len(),
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32([c[0], c[1]]);
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32([c[0], c[1]]);
            }
        }
        other => return Err(WeightsError::UnsupportedType(other)),
    }
    Ok(())
}

pub(super) fn dot(ty: GgmlType, bytes: &[u8], x: &[f32]) -> Result<f32> {
    let size = elem_size(ty);
    if bytes.len() != x.len() * size {
        return Err(WeightsError::Length {
            what: "dot weights",
            expected: x.len() * size,
            found: bytes.len(),
        });
    }
    let decode: fn(&[u8]) -> f32 = match ty {
        GgmlType::F32 => |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        GgmlType::F16 => |c| f16_to_f32([c[0], c[1]]),
        GgmlType::BF16 => |c| bf16_to_f32([c[0], c[1]]),
        other => return Err(WeightsError::UnsupportedType(other)),
    };
    Ok(bytes
        .chunks_exact(size)
        .zip(x)
        .map(|(c, &x)| decode(c) * x)
        .sum())
}
