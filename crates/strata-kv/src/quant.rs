//! Store-side quantization and read-side dequantization of one (token, KV head) row.
//!
//! The scale of an 8-bit row is `max|x| / Q` (Q = 448 for e4m3, 127 for int8), stored as f32
//! beside the values, so a kernel reconstructs `x = q * scale` with one multiply per element.

use half::{bf16, f16};

use crate::fp8::{decode_e4m3, encode_e4m3, E4M3_MAX};
use crate::KvFormat;

const INT8_MAX: f32 = 127.0;

/// Encodes `src` (one head's `head_dim` values) into `dst` (`head_dim * element_bytes`
/// bytes) and returns the row's scale (1.0 for formats without scales).
pub fn encode_row(format: KvFormat, src: &[f32], dst: &mut [u8]) -> f32 {
    debug_assert_eq!(dst.len(), src.len() * format.element_bytes());
    match format {
        KvFormat::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
            1.0
        }
        KvFormat::Bf16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
            1.0
        }
        KvFormat::F16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
            1.0
        }
        KvFormat::Fp8E4m3PerTokenHead => {
            let scale = row_scale(src, E4M3_MAX);
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (d, x) in dst.iter_mut().zip(src) {
                *d = encode_e4m3(x * inv);
            }
            scale
        }
        KvFormat::Int8PerTokenHead => {
            let scale = row_scale(src, INT8_MAX);
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (d, x) in dst.iter_mut().zip(src) {
                let q = (x * inv).round().clamp(-INT8_MAX, INT8_MAX) as i8;
                *d = q as u8;
            }
            scale
        }
    }
}

/// Decodes one row written by [`encode_row`] back to f32.
pub fn decode_row(format: KvFormat, src: &[u8], scale: f32, dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len() * format.element_bytes());
    match format {
        KvFormat::F32 => {
            let (words, _) = src.as_chunks::<4>();
            for (x, s) in dst.iter_mut().zip(words) {
                *x = f32::from_le_bytes(*s);
            }
        }
        KvFormat::Bf16 => {
            // `bf16::to_f32`'s bits (a NaN gains its quiet bit) as a select over fixed-size
            // pairs, not a branch over checked slices, so the loop vectorizes.
            let (pairs, _) = src.as_chunks::<2>();
            for (x, s) in dst.iter_mut().zip(pairs) {
                let b = u16::from_le_bytes(*s);
                let b = if b & 0x7fff > 0x7f80 { b | 0x40 } else { b };
                *x = f32::from_bits(u32::from(b) << 16);
            }
        }
        KvFormat::F16 => {
            for (x, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *x = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        KvFormat::Fp8E4m3PerTokenHead => {
            for (x, s) in dst.iter_mut().zip(src) {
                *x = decode_e4m3(*s) * scale;
            }
        }
        KvFormat::Int8PerTokenHead => {
            for (x, s) in dst.iter_mut().zip(src) {
                *x = (*s as i8) as f32 * scale;
            }
        }
    }
}

/// `max|x| / qmax`: the largest magnitude lands exactly on the format's largest code.
fn row_scale(src: &[f32], qmax: f32) -> f32 {
    let amax = src.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    amax / qmax
}
