//! OCP FP8 E4M3 ("e4m3fn"): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no
//! infinities, NaN at 0x7f / 0xff, largest finite magnitude 448.

/// Largest finite E4M3 magnitude; per-(token, head) scales map the row's max onto it.
pub const E4M3_MAX: f32 = 448.0;

/// Smallest normal E4M3 magnitude (2^-6); below it values are subnormal, in steps of 2^-9.
const MIN_NORMAL: f32 = 1.0 / 64.0;
const SUBNORMAL_STEP: f32 = 1.0 / 512.0;

/// Rounds `x` to the nearest E4M3 value (ties to even), saturating at +-448. NaN maps to NaN.
pub fn encode_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let mag = x.abs().min(E4M3_MAX);
    let code = if mag < MIN_NORMAL {
        // Subnormals are evenly spaced, so rounding is one division; a result of 8 is the
        // smallest normal, whose code happens to be 8 as well.
        (mag / SUBNORMAL_STEP).round_ties_even() as u8
    } else {
        // `mag` is a normal f32 here, so its exponent field gives floor(log2(mag)) exactly.
        let exp = ((mag.to_bits() >> 23) & 0xff) as i32 - 127;
        let mantissa = mag / f32::from_bits(((exp + 127) as u32) << 23) - 1.0;
        let mut m = (mantissa * 8.0).round_ties_even() as i32;
        let mut e = exp;
        if m == 8 {
            m = 0;
            e += 1;
        }
        (((e + 7) as u8) << 3) | m as u8
    };
    sign | code
}

/// The value of an E4M3 code.
pub fn decode_e4m3(code: u8) -> f32 {
    E4M3_TABLE[code as usize]
}

const fn decode_slow(code: u8) -> f32 {
    let negative = code & 0x80 != 0;
    let e = ((code >> 3) & 0x0f) as i32;
    let m = (code & 0x07) as u32;
    let mag = if e == 0x0f && m == 0x07 {
        f32::NAN
    } else if e == 0 {
        // m * 2^-9, exact in f32.
        m as f32 / 512.0
    } else {
        // 2^(e-7) * (1 + m/8): build the f32 bits directly.
        f32::from_bits((((e - 7 + 127) as u32) << 23) | (m << 20))
    };
    if negative {
        -mag
    } else {
        mag
    }
}

const fn build_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = decode_slow(i as u8);
        i += 1;
    }
    table
}

static E4M3_TABLE: [f32; 256] = build_table();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let v = decode_e4m3(code);
            if v.is_nan() {
                assert!(code & 0x7f == 0x7f, "code {code:#x}");
                continue;
            }
            let back = encode_e4m3(v);
            // +0 and -0 are distinct codes with equal values.
            assert_eq!(decode_e4m3(back), v, "code {code:#x}");
            assert_eq!(back, code, "code {code:#x} value {v}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(decode_e4m3(0x7e), 448.0);
        assert_eq!(decode_e4m3(0x01), 1.0 / 512.0);
        assert_eq!(decode_e4m3(0x08), 1.0 / 64.0);
        assert_eq!(decode_e4m3(0x38), 1.0);
        assert_eq!(encode_e4m3(1000.0), 0x7e);
        assert_eq!(encode_e4m3(-1000.0), 0xfe);
        // 1.0625 is halfway between 1.0 and 1.125: ties go to the even mantissa (1.0).
        assert_eq!(encode_e4m3(1.0625), 0x38);
        assert_eq!(encode_e4m3(1.1875), 0x3a);
    }

    #[test]
    fn rounding_is_to_nearest() {
        let mut x = -460.0f32;
        while x < 460.0 {
            let got = decode_e4m3(encode_e4m3(x));
            let clamped = x.clamp(-E4M3_MAX, E4M3_MAX);
            let best = (0..=255u8)
                .map(decode_e4m3)
                .filter(|v| !v.is_nan())
                .map(|v| (v - clamped).abs())
                .fold(f32::INFINITY, f32::min);
            assert!((got - clamped).abs() <= best, "x {x}: got {got}");
            x += 0.37;
        }
    }
}
