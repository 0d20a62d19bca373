//! Dot-product kernels shared by matmul, attention and embedding.
//!
//! A portable chunked loop over `LANES` partial sums, and on x86-64 an AVX2 version picked
//! at run time (the baseline target only has SSE2). The reduction order is fixed, so a
//! result never depends on the thread count.

use half::bf16;

const LANES: usize = 16;

/// A weight element that widens exactly to f32.
pub(crate) trait Widen: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for bf16 {
    /// bf16 is the top half of an f32: a shift, which vectorises (unlike a library call).
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

#[inline(always)]
fn reduce(acc: &[f32; LANES]) -> f32 {
    // Pairwise, in a fixed order.
    let mut v = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[inline(always)]
fn dot_portable<W: Widen>(w: &[W], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (wc, xc) = (w.chunks_exact(LANES), x.chunks_exact(LANES));
    let (wt, xt) = (wc.remainder(), xc.remainder());
    for (wc, xc) in wc.zip(xc) {
        for l in 0..LANES {
            acc[l] += wc[l].widen() * xc[l];
        }
    }
    let mut s = reduce(&acc);
    for (&a, &b) in wt.iter().zip(xt) {
        s += a.widen() * b;
    }
    s
}

/// AVX2 kernels with explicit intrinsics: LLVM's auto-vectoriser split the portable loop
/// into 2-wide pieces, which left GEMV compute-bound. Two 8-wide accumulators, plain
/// multiply + add (no FMA, so the result does not depend on an extra CPU feature).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::reduce;
    use half::bf16;
    use std::arch::x86_64::*;

    /// Lanes 0..8 from `a`, 8..16 from `b`, then the same fixed tree as `reduce`.
    #[target_feature(enable = "avx2")]
    fn finish(a: __m256, b: __m256) -> f32 {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` has room for 16 f32 and unaligned stores are allowed.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), a);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), b);
        }
        reduce(&lanes)
    }

    /// # Safety
    /// The CPU must support AVX2; `w.len() == x.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len() / 16 * 16;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let (mut a, mut b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= len of both slices.
            unsafe {
                let w0 = _mm256_loadu_ps(wp.add(i));
                let w1 = _mm256_loadu_ps(wp.add(i + 8));
                let x0 = _mm256_loadu_ps(xp.add(i));
                let x1 = _mm256_loadu_ps(xp.add(i + 8));
                a = _mm256_add_ps(a, _mm256_mul_ps(w0, x0));
                b = _mm256_add_ps(b, _mm256_mul_ps(w1, x1));
            }
            i += 16;
        }
        let mut s = finish(a, b);
        for j in n..w.len() {
            s += w[j] * x[j];
        }
        s
    }

    /// bf16 -> f32 is a zero-extend and a 16-bit shift.
    #[target_feature(enable = "avx2")]
    fn widen8(v: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    }

    /// # Safety
    /// The CPU must support AVX2; `w.len() == x.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_bf16(w: &[bf16], x: &[f32]) -> f32 {
        let n = w.len() / 16 * 16;
        let (wp, xp) = (w.as_ptr() as *const u16, x.as_ptr());
        let (mut a, mut b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= len of both slices; bf16 is a transparent u16.
            unsafe {
                let w0 = widen8(_mm_loadu_si128(wp.add(i) as *const __m128i));
                let w1 = widen8(_mm_loadu_si128(wp.add(i + 8) as *const __m128i));
                let x0 = _mm256_loadu_ps(xp.add(i));
                let x1 = _mm256_loadu_ps(xp.add(i + 8));
                a = _mm256_add_ps(a, _mm256_mul_ps(w0, x0));
                b = _mm256_add_ps(b, _mm256_mul_ps(w1, x1));
            }
            i += 16;
        }
        let mut s = finish(a, b);
        for j in n..w.len() {
            s += w[j].to_f32() * x[j];
        }
        s
    }
}

/// A weight element type with a dot kernel.
pub(crate) trait DotWith: Widen {
    fn dot_with(w: &[Self], x: &[f32]) -> f32;
}

impl DotWith for f32 {
    #[inline]
    fn dot_with(w: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above); lengths are checked by `dot`.
            return unsafe { avx2::dot_f32(w, x) };
        }
        dot_portable(w, x)
    }
}

impl DotWith for bf16 {
    #[inline]
    fn dot_with(w: &[bf16], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above); lengths are checked by `dot`.
            return unsafe { avx2::dot_bf16(w, x) };
        }
        dot_portable(w, x)
    }
}

/// `w . x` in f32 with 16 partial sums and a fixed reduction order (deterministic on a
/// given machine whatever the thread count).
#[inline]
pub(crate) fn dot<W: DotWith>(w: &[W], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot: length mismatch");
    W::dot_with(w, x)
}

/// `acc += a * x`, vectorisable.
#[inline]
pub(crate) fn axpy(acc: &mut [f32], a: f32, x: &[f32]) {
    axpy_with(acc, a, x);
}

/// [`axpy`] over a row of any [`Widen`] element: the same multiply and add on each value
/// widened exactly, so a bf16 row gives the bits of the same row widened to f32 first.
#[inline]
pub(crate) fn axpy_with<W: Widen>(acc: &mut [f32], a: f32, x: &[W]) {
    for (o, &v) in acc.iter_mut().zip(x) {
        *o += a * v.widen();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_for_all_lengths() {
        for len in [0usize, 1, 5, 15, 16, 17, 33, 100, 257] {
            let w: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25)
                .collect();
            let x: Vec<f32> = (0..len).map(|i| (i % 5) as f32 - 2.0).collect();
            // Small integers and quarters: every partial sum is exact, so equality holds.
            let want: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert_eq!(dot(&w, &x) as f64, want, "len {len}");
            let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            assert_eq!(dot(&wb, &x) as f64, want, "bf16 len {len}");
            // The portable fallback (not taken on AVX2 machines) must agree too.
            assert_eq!(dot_portable(&w, &x) as f64, want, "portable len {len}");
            assert_eq!(
                dot_portable(&wb, &x) as f64,
                want,
                "portable bf16 len {len}"
            );
        }
    }
}
