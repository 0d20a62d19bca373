//! Error bounds of every stored format against the f32 input.

use proptest::prelude::*;
use strata_kv::quant::{decode_row, encode_row};
use strata_kv::KvFormat;

fn round_trip(format: KvFormat, row: &[f32]) -> (Vec<f32>, f32) {
    let mut bytes = vec![0u8; row.len() * format.element_bytes()];
    let scale = encode_row(format, row, &mut bytes);
    let mut back = vec![0.0; row.len()];
    decode_row(format, &bytes, scale, &mut back);
    (back, scale)
}

fn amax(row: &[f32]) -> f32 {
    row.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

fn rows() -> impl Strategy<Value = Vec<f32>> {
    rows_up_to(6)
}

/// Rows with magnitudes spread over several decades, below `10^max_exp`.
fn rows_up_to(max_exp: i32) -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec(-1.0f32..1.0, 1..300), -6i32..max_exp)
        .prop_map(|(v, e)| v.into_iter().map(|x| x * 10f32.powi(e)).collect())
}

proptest! {
    #[test]
    fn f32_is_exact(row in rows()) {
        let (back, _) = round_trip(KvFormat::F32, &row);
        prop_assert_eq!(back, row);
    }

    #[test]
    fn bf16_relative_error_within_half_an_ulp(row in rows()) {
        let (back, _) = round_trip(KvFormat::Bf16, &row);
        for (x, y) in row.iter().zip(&back) {
            prop_assert!((x - y).abs() <= x.abs() / 256.0, "{x} -> {y}");
        }
    }

    #[test]
    // f16 tops out at 65504 (larger values become infinite, as in an f16 model).
    fn f16_error_within_half_an_ulp(row in rows_up_to(5)) {
        let (back, _) = round_trip(KvFormat::F16, &row);
        for (x, y) in row.iter().zip(&back) {
            // Relative 2^-11 for normals, absolute 2^-25 in the subnormal range.
            prop_assert!((x - y).abs() <= x.abs() / 2048.0 + 2f32.powi(-25), "{x} -> {y}");
        }
    }

    #[test]
    fn fp8_error_within_e4m3_rounding(row in rows()) {
        let (back, scale) = round_trip(KvFormat::Fp8E4m3PerTokenHead, &row);
        prop_assert!((scale - amax(&row) / 448.0).abs() <= scale * 1e-6);
        for (x, y) in row.iter().zip(&back) {
            // Half a step of a 3-bit mantissa (1/16 relative), or half the subnormal
            // step (2^-10 of the scale), plus f32 rounding of the scaling.
            let bound = (x.abs() / 16.0 + scale / 1024.0) * (1.0 + 1e-5);
            prop_assert!((x - y).abs() <= bound, "{x} -> {y} (scale {scale})");
        }
        // The row's largest magnitude is represented exactly (up to f32 rounding).
        let m = amax(&row);
        prop_assert!((amax(&back) - m).abs() <= m * 1e-6);
    }

    #[test]
    fn int8_error_within_half_a_step(row in rows()) {
        let (back, scale) = round_trip(KvFormat::Int8PerTokenHead, &row);
        prop_assert!((scale - amax(&row) / 127.0).abs() <= scale * 1e-6);
        for (x, y) in row.iter().zip(&back) {
            prop_assert!((x - y).abs() <= scale * 0.5 * (1.0 + 1e-4), "{x} -> {y} (scale {scale})");
        }
    }
}

#[test]
fn zero_rows_stay_zero() {
    for format in [KvFormat::Fp8E4m3PerTokenHead, KvFormat::Int8PerTokenHead] {
        let (back, scale) = round_trip(format, &[0.0; 8]);
        assert_eq!(scale, 0.0);
        assert!(back.iter().all(|&x| x == 0.0));
    }
}

#[test]
fn eight_bit_formats_are_coarser_than_bf16() {
    // Guards the bounds above against a format silently storing more precision than
    // claimed (e.g. a scale of 1.0 with wide values).
    let row: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let err = |f| {
        let (back, _) = round_trip(f, &row);
        row.iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max)
    };
    assert!(err(KvFormat::Fp8E4m3PerTokenHead) > err(KvFormat::Bf16));
    assert!(err(KvFormat::Int8PerTokenHead) > err(KvFormat::Bf16));
    assert!(err(KvFormat::Fp8E4m3PerTokenHead) < 1.0 / 16.0);
    assert!(err(KvFormat::Int8PerTokenHead) < 1.0 / 254.0 + 1e-6);
}

/// Every bf16 bit pattern reads back with `half`'s bits, NaNs included.
#[test]
fn bf16_rows_read_back_as_half_does() {
    let src: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let mut dst = vec![0f32; 1 << 16];
    strata_kv::quant::decode_row(strata_kv::KvFormat::Bf16, &src, 1.0, &mut dst);
    for (i, x) in dst.iter().enumerate() {
        let want = half::bf16::from_bits(i as u16).to_f32();
        assert_eq!(x.to_bits(), want.to_bits(), "bf16 bits {i:#06x}");
    }
}
