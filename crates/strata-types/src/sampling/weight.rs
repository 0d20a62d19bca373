//! The arithmetic of a draw, fixed to the bit so that every backend computes the same
//! token from the same logits and uniform: each candidate's weight is an integer (its
//! probability relative to the best, in fixed point), so every sum is exact and the order
//! a device adds in changes nothing; the exponential is a fixed sequence of IEEE operations
//! (`kernels/sampling.cu` has the same one, written with intrinsics that cannot be fused or
//! reordered).

use super::{key, SamplingParams};

/// Scaled values this far below the row's best weigh 0 (e^-40 is below one unit of the
/// finest fixed point used).
pub const WEIGHT_CUTOFF: f32 = -40.0;

/// Fixed-point bits of a weight at most: a weight of 1 (the best candidate) is 2^44.
const WEIGHT_BITS: u32 = 44;

/// The fixed-point bits for a row of `n` values: as many as keep the row's total below
/// 2^63 (44 for every vocabulary up to 2^19 ids).
pub fn weight_shift(n: usize) -> u32 {
    let ceil_log2 = usize::BITS - n.max(1).saturating_sub(1).leading_zeros();
    WEIGHT_BITS.min(63 - ceil_log2)
}

/// A logit as the draw sees it: NaN as -inf, divided by the temperature (times `inv_t`,
/// in f32), -0 as +0 (so equal values order by id alone).
#[inline]
pub fn scaled(x: f32, inv_t: f32) -> f32 {
    key(x) * inv_t + 0.0
}

/// `s` relative to the row's best `max` (0 for the best itself, also when it is +inf).
#[inline]
pub fn relative(s: f32, max: f32) -> f32 {
    if s == max {
        0.0
    } else {
        s - max
    }
}

/// The fixed-point weight `floor(exp(d) * 2^shift)` of a relative value `d <= 0`.
#[inline]
pub fn fixed_weight(d: f32, shift: u32) -> u64 {
    if d.is_nan() || d < WEIGHT_CUTOFF {
        return 0;
    }
    let scale = f64::from_bits(((1023 + shift) as u64) << 52);
    (exp_neg(d as f64) * scale) as u64
}

/// e^x for x in [-40, 0]: x = k ln 2 + r (k an integer, |r| <= ln 2 / 2, the product
/// taken in two parts with fused multiply-adds), e^r by its Taylor series to r^13 in
/// Horner form, then scaled by 2^k exactly. Not the last bit of accuracy (a few units in
/// the 53rd bit), but the same bits wherever the same operations run.
///
/// A fused multiply-add is exactly rounded whether the CPU or a library does it, so where
/// the CPU has the instruction it is used: without it each `mul_add` is a libm call, and at
/// Gemma's 262,144 ids a row's weights took about ten times as long
/// (`cargo bench -p strata-kernels -- sample_row`).
#[inline]
pub fn exp_neg(x: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the instructions the function is compiled for.
        return unsafe { exp_neg_fma(x) };
    }
    exp_neg_ops(x)
}

/// [`exp_neg`] compiled with the FMA instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn exp_neg_fma(x: f64) -> f64 {
    exp_neg_ops(x)
}

/// Runs `f` compiled with the FMA instruction where the CPU has it, so the weights
/// computed inside ([`fixed_weight`]) take their multiply-adds inline and consecutive ones
/// overlap: a loop over a row's weights belongs in here. The results are the same bits
/// either way (a fused multiply-add rounds once, in hardware or in libm).
#[inline]
pub fn with_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the instructions the function is compiled for.
        return unsafe { run_with_fma(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn run_with_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[inline(always)]
fn exp_neg_ops(x: f64) -> f64 {
    const LOG2_E: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    // 1/13!, 1/12!, ..., 1/0!, each the nearest f64.
    const TAYLOR: [u64; 14] = [
        0x3de6_1246_13a8_6d09,
        0x3e21_eed8_eff8_d898,
        0x3e5a_e645_67f5_44e4,
        0x3e92_7e4f_b778_9f5c,
        0x3ec7_1de3_a556_c734,
        0x3efa_01a0_1a01_a01a,
        0x3f2a_01a0_1a01_a01a,
        0x3f56_c16c_16c1_6c17,
        0x3f81_1111_1111_1111,
        0x3fa5_5555_5555_5555,
        0x3fc5_5555_5555_5555,
        0x3fe0_0000_0000_0000,
        0x3ff0_0000_0000_0000,
        0x3ff0_0000_0000_0000,
    ];
    let k = (x * LOG2_E).round();
    let r = (-k).mul_add(LN2_HI, x);
    let r = (-k).mul_add(LN2_LO, r);
    let mut p = f64::from_bits(TAYLOR[0]);
    for &c in &TAYLOR[1..] {
        p = p.mul_add(r, f64::from_bits(c));
    }
    p * f64::from_bits(((1023 + k as i64) as u64) << 52)
}

/// The candidate order as one unsigned key, smallest first: scaled value descending, then
/// id ascending (`(rank(s) << 32) | id`).
#[inline]
pub fn rank(s: f32) -> u32 {
    let b = s.to_bits();
    let ordered = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    !ordered
}

/// `floor(a * b / 2^s)` for `s` in 1..64, exactly.
#[inline]
pub fn mul_shr(a: u64, b: u64, s: u32) -> u64 {
    ((a as u128 * b as u128) >> s) as u64
}

/// The 53 bits of a draw's uniform that it uses (`u / 2^53` is the uniform in [0, 1)).
#[inline]
pub fn uniform_bits(uniform: u64) -> u64 {
    uniform >> 11
}

/// One row's settings in the form both the host and a device draw use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrawSettings {
    /// Inverse temperature, `1 / temperature`, the logits are multiplied by.
    pub inv_t: f32,
    /// 0: no top-k.
    pub top_k: usize,
    /// `top_p * 2^32`, truncated; `None`: no top-p.
    pub top_p32: Option<u64>,
    /// `ln(min_p)` as f32: candidates with a relative value below it go; `None`: no min-p.
    pub min_rel: Option<f32>,
}

impl DrawSettings {
    /// The draw settings of `p` (`top_p` of 1 and `min_p` of 0 become `None`).
    pub fn new(p: &SamplingParams) -> Self {
        Self {
            inv_t: 1.0 / p.temperature,
            top_k: p.top_k,
            top_p32: (p.top_p < 1.0).then_some((p.top_p as f64 * 4_294_967_296.0) as u64),
            min_rel: (p.min_p > 0.0).then_some((p.min_p as f64).ln() as f32),
        }
    }

    /// Whether any filter is on, which makes the draw walk the candidates in rank order
    /// (not id order).
    pub fn filtered(&self) -> bool {
        self.top_k > 0 || self.top_p32.is_some() || self.min_rel.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_is_close_to_the_library_exponential() {
        let mut worst: f64 = 0.0;
        for i in 0..=400_000 {
            let x = -40.0 * i as f64 / 400_000.0;
            let rel = (exp_neg(x) - x.exp()).abs() / x.exp();
            worst = worst.max(rel);
        }
        assert!(worst < 1e-15, "worst relative error {worst:e}");
        assert_eq!(exp_neg(0.0), 1.0);
    }

    /// The FMA instruction and the library's `fma` round alike: the dispatch in `exp_neg`
    /// changes no bit (where the CPU has the instruction to compare with).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_neg_gives_the_same_bits_with_the_fma_instruction() {
        if !std::arch::is_x86_feature_detected!("fma") {
            eprintln!("no FMA instruction on this CPU: nothing to compare");
            return;
        }
        let mut rng = super::super::SamplerRng::new(5);
        for i in 0..1_000_000 {
            let x = match i % 3 {
                0 => -40.0 * rng.next_f64(),
                1 => -(i as f64) * 4e-5,
                _ => -(rng.next_f64() * 1e-6),
            };
            // SAFETY: the CPU has the instruction (checked above).
            let fused = unsafe { exp_neg_fma(x) };
            assert_eq!(fused.to_bits(), exp_neg_ops(x).to_bits(), "x = {x:e}");
        }
    }

    #[test]
    fn weights_fall_with_the_value_and_fit_the_total() {
        assert_eq!(weight_shift(262_144), 44);
        assert_eq!(weight_shift(1 << 19), 44);
        assert_eq!(weight_shift((1 << 19) + 1), 43);
        assert_eq!(fixed_weight(0.0, 44), 1 << 44);
        assert_eq!(fixed_weight(-41.0, 44), 0);
        assert_eq!(fixed_weight(f32::NEG_INFINITY, 44), 0);
        let mut last = u64::MAX;
        for i in 0..100_000 {
            let w = fixed_weight(-(i as f32) * 4e-4, 44);
            assert!(w <= last, "weight rose at step {i}");
            last = w;
        }
    }

    #[test]
    fn rank_orders_values_descending_with_zeros_equal() {
        let vals = [
            f32::INFINITY,
            3.0,
            0.5,
            0.0,
            -1e-30,
            -2.0,
            f32::NEG_INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(rank(w[0]) < rank(w[1]), "{} before {}", w[0], w[1]);
        }
        assert_eq!(rank(scaled(-0.0, 1.0)), rank(scaled(0.0, 1.0)));
        assert_eq!(scaled(f32::NAN, 2.0), f32::NEG_INFINITY);
    }

    #[test]
    fn mul_shr_is_exact_at_the_extremes() {
        assert_eq!(
            mul_shr(u64::MAX >> 1, (1 << 53) - 1, 53),
            (((u64::MAX >> 1) as u128 * ((1u128 << 53) - 1)) >> 53) as u64
        );
        assert_eq!(mul_shr(1 << 44, 1 << 32, 32), 1 << 44);
        assert_eq!(uniform_bits(u64::MAX), (1 << 53) - 1);
    }
}
