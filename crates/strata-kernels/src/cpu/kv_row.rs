//! A key or value row as attention reads it (f32, or bf16 in place in a pool), and the two
//! products attention takes of it for all the query heads of a KV group at once: the
//! scores `q_h . k` and the weighted sums `acc_h += w_h v`.
//!
//! bf16 widens exactly and both element types take the same arithmetic, so a row read as
//! bf16 in place and the same row converted to f32 first give the same bits (the host pool,
//! which gathers f32 rows, and the paged pool, which reads bf16 in place, agree bit for
//! bit). Where the CPU has AVX2 and the head dim allows, the scores take 16 partial sums in
//! two 8-lane halves reduced by a shuffle tree, and the weighted sums [`axpy`]'s arithmetic
//! (one multiply and one add a value); otherwise each head takes [`dot`] and [`axpy`]. What
//! the grouped forms save is the row's loads and conversions, once a key instead of once a
//! head, and `dot`'s 16-lane scalar reduction.

use half::bf16;

use super::dot::{axpy, axpy_with, dot};

/// A key or value row as the kernel reads it.
pub enum KvRow<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values, widened exactly where they are used.
    Bf16(&'a [bf16]),
}

impl KvRow<'_> {
    /// The row's values.
    pub fn len(&self) -> usize {
        match self {
            KvRow::F32(v) => v.len(),
            KvRow::Bf16(v) => v.len(),
        }
    }

    /// Whether the row holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `scores[h] = self . qs[h * d .. (h + 1) * d]` for each head `h` of `scores`.
    pub(crate) fn dot_group(&self, qs: &[f32], scores: &mut [f32]) {
        let d = qs.len() / scores.len().max(1);
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(16) && self.len() == d && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above); the row holds d values, d a whole
            // number of 16-value chunks, and `qs` holds `scores.len()` rows of d.
            unsafe {
                match self {
                    KvRow::F32(k) => avx2::dot_group(k.as_ptr(), qs, scores),
                    KvRow::Bf16(k) => avx2::dot_group(k.as_ptr().cast::<u16>(), qs, scores),
                }
            }
            return;
        }
        for (h, s) in scores.iter_mut().enumerate() {
            let q = &qs[h * d..(h + 1) * d];
            *s = match self {
                KvRow::F32(k) => dot(k, q),
                KvRow::Bf16(k) => dot(k, q),
            };
        }
    }

    /// `acc[h * d .. (h + 1) * d] += ws[h] * self` for each head `h` of `ws`.
    pub(crate) fn axpy_group(&self, acc: &mut [f32], ws: &[f32]) {
        let d = acc.len() / ws.len().max(1);
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(8) && self.len() == d && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above); the row holds d values, d a whole
            // number of 8-value chunks, and `acc` holds `ws.len()` rows of d.
            unsafe {
                match self {
                    KvRow::F32(v) => avx2::axpy_group(v.as_ptr(), acc, ws),
                    KvRow::Bf16(v) => avx2::axpy_group(v.as_ptr().cast::<u16>(), acc, ws),
                }
            }
            return;
        }
        for (h, &w) in ws.iter().enumerate() {
            let out = &mut acc[h * d..(h + 1) * d];
            match self {
                KvRow::F32(v) => axpy(out, w, v),
                KvRow::Bf16(v) => axpy_with(out, w, v),
            }
        }
    }
}

/// `acc[h * d ..] += Σ_j ws[h * n + j] * rows[j]` for each head `h` (`ws` head-major,
/// `n = rows.len()`), the rows taken in order for every element: the same operations in the
/// same order as [`KvRow::axpy_group`] row by row, so the same bits. Where the CPU has AVX2
/// and every row has one element type, it walks the rows eight values at a time with the
/// heads' sums in registers, so the sums are not loaded and stored once a row.
pub(crate) fn axpy_rows(rows: &[KvRow<'_>], ws: &[f32], acc: &mut [f32]) {
    let n = rows.len();
    let heads = ws.len().checked_div(n).unwrap_or(0);
    #[cfg(target_arch = "x86_64")]
    let d = acc.len().checked_div(heads).unwrap_or(0);
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8)
        && d > 0
        && rows.iter().all(|r| r.len() == d)
        && std::arch::is_x86_feature_detected!("avx2")
    {
        let f32s: Option<Vec<*const f32>> = rows
            .iter()
            .map(|r| match r {
                KvRow::F32(v) => Some(v.as_ptr()),
                KvRow::Bf16(_) => None,
            })
            .collect();
        if let Some(ptrs) = f32s {
            // SAFETY: AVX2 is present; every row holds d values, d a multiple of 8; `ws`
            // holds `heads` rows of n weights and `acc` `heads` rows of d.
            unsafe { avx2::axpy_rows(&ptrs, ws, acc, d) };
            return;
        }
        let bf16s: Option<Vec<*const u16>> = rows
            .iter()
            .map(|r| match r {
                KvRow::Bf16(v) => Some(v.as_ptr().cast::<u16>()),
                KvRow::F32(_) => None,
            })
            .collect();
        if let Some(ptrs) = bf16s {
            // SAFETY: as above.
            unsafe { avx2::axpy_rows(&ptrs, ws, acc, d) };
            return;
        }
    }
    let mut w = vec![0f32; heads];
    for (j, row) in rows.iter().enumerate() {
        for (h, w) in w.iter_mut().enumerate() {
            *w = ws[h * n + j];
        }
        row.axpy_group(acc, &w);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// A row element type whose 8 values load as 8 f32.
    pub(super) trait Load8: Copy {
        /// # Safety
        /// AVX2; 8 values readable at `p`.
        unsafe fn load8(p: *const Self) -> __m256;
    }

    impl Load8 for f32 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller's.
            unsafe { _mm256_loadu_ps(p) }
        }
    }

    /// bf16 bits: a zero-extend and a 16-bit shift, exact.
    impl Load8 for u16 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const u16) -> __m256 {
            // SAFETY: the caller's.
            unsafe {
                let v = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
            }
        }
    }

    /// The sum of `a + b`'s 8 lanes in a fixed tree (halves, then pairs): a few shuffles,
    /// where `dot`'s 16-lane scalar tree costs as much as the products at d = 64.
    #[target_feature(enable = "avx2")]
    fn finish(a: __m256, b: __m256) -> f32 {
        let s = _mm256_add_ps(a, b);
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Heads at a time: two accumulators each, within AVX2's 16 registers with the row's.
    const HEADS: usize = 4;

    /// # Safety
    /// AVX2; `row` holds `d = qs.len() / scores.len()` values, d a multiple of 16.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn dot_group<T: Load8>(row: *const T, qs: &[f32], scores: &mut [f32]) {
        let d = qs.len() / scores.len();
        for (hb, out) in scores.chunks_mut(HEADS).enumerate() {
            let q0 = qs[hb * HEADS * d..].as_ptr();
            // A fixed head count, so each head's two sums stay in registers.
            // SAFETY: the caller's; `out` holds the chunk's heads, each with d values of q.
            unsafe {
                match out.len() {
                    1 => dot_heads::<T, 1>(row, q0, d, out),
                    2 => dot_heads::<T, 2>(row, q0, d, out),
                    3 => dot_heads::<T, 3>(row, q0, d, out),
                    _ => dot_heads::<T, HEADS>(row, q0, d, out),
                }
            }
        }
    }

    /// `N` heads' scores (q at `q0`, heads d apart) against one row.
    ///
    /// # Safety
    /// AVX2; `row` holds d values, d a multiple of 16; `q0` N heads of d; `out` N values.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dot_heads<T: Load8, const N: usize>(
        row: *const T,
        q0: *const f32,
        d: usize,
        out: &mut [f32],
    ) {
        let mut a = [_mm256_setzero_ps(); N];
        let mut b = [_mm256_setzero_ps(); N];
        for i in (0..d).step_by(16) {
            // SAFETY: i + 16 <= d values of the row and of each head's q.
            unsafe {
                let k0 = T::load8(row.add(i));
                let k1 = T::load8(row.add(i + 8));
                for h in 0..N {
                    let q = q0.add(h * d + i);
                    a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(k0, _mm256_loadu_ps(q)));
                    b[h] = _mm256_add_ps(b[h], _mm256_mul_ps(k1, _mm256_loadu_ps(q.add(8))));
                }
            }
        }
        for (h, s) in out.iter_mut().enumerate().take(N) {
            *s = finish(a[h], b[h]);
        }
    }

    /// Heads whose sums stay in registers in [`axpy_rows`].
    const SUM_HEADS: usize = 8;

    /// Bytes of value rows a block of [`axpy_heads`] walks eight values at a time.
    const ROW_BLOCK_BYTES: usize = 8 << 10;

    /// # Safety
    /// AVX2; each row holds d values, d a multiple of 8; `ws` holds `acc.len() / d` rows
    /// of `rows.len()` weights.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn axpy_rows<T: Load8>(
        rows: &[*const T],
        ws: &[f32],
        acc: &mut [f32],
        d: usize,
    ) {
        let heads = acc.len() / d;
        for h0 in (0..heads).step_by(SUM_HEADS) {
            // A fixed head count, so the heads' sums stay in registers.
            // SAFETY: the caller's, for heads h0 .. h0 + the count.
            unsafe {
                match (heads - h0).min(SUM_HEADS) {
                    1 => axpy_heads::<T, 1>(rows, ws, acc, d, h0),
                    2 => axpy_heads::<T, 2>(rows, ws, acc, d, h0),
                    3 => axpy_heads::<T, 3>(rows, ws, acc, d, h0),
                    4 => axpy_heads::<T, 4>(rows, ws, acc, d, h0),
                    5 => axpy_heads::<T, 5>(rows, ws, acc, d, h0),
                    6 => axpy_heads::<T, 6>(rows, ws, acc, d, h0),
                    7 => axpy_heads::<T, 7>(rows, ws, acc, d, h0),
                    _ => axpy_heads::<T, SUM_HEADS>(rows, ws, acc, d, h0),
                }
            }
        }
    }

    /// [`axpy_rows`] for heads `h0 .. h0 + N`.
    ///
    /// # Safety
    /// As [`axpy_rows`], with heads `h0 .. h0 + N` inside `acc` and `ws`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn axpy_heads<T: Load8, const N: usize>(
        rows: &[*const T],
        ws: &[f32],
        acc: &mut [f32],
        d: usize,
        h0: usize,
    ) {
        let n = rows.len();
        // Rows a block, as many as stay in the first-level cache while the block's eight
        // values at a time walk across them (each row in order within and across blocks,
        // so the same bits as one block).
        let block = (ROW_BLOCK_BYTES / (d * std::mem::size_of::<T>())).max(8);
        for j0 in (0..n).step_by(block) {
            for i in (0..d).step_by(8) {
                let mut sum = [_mm256_setzero_ps(); N];
                for (k, s) in sum.iter_mut().enumerate() {
                    // SAFETY: head h0 + k's sums hold d values from i.
                    *s = unsafe { _mm256_loadu_ps(acc.as_ptr().add((h0 + k) * d + i)) };
                }
                for (j, &row) in rows.iter().enumerate().skip(j0).take(block) {
                    // SAFETY: the row holds d values.
                    let v = unsafe { T::load8(row.add(i)) };
                    for (k, s) in sum.iter_mut().enumerate() {
                        // SAFETY: `ws` holds n weights for each head.
                        let w = unsafe { *ws.get_unchecked((h0 + k) * n + j) };
                        *s = _mm256_add_ps(*s, _mm256_mul_ps(_mm256_set1_ps(w), v));
                    }
                }
                for (k, s) in sum.iter().enumerate() {
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add((h0 + k) * d + i), *s) };
                }
            }
        }
    }

    /// # Safety
    /// AVX2; `row` holds `d = acc.len() / ws.len()` values, d a multiple of 8.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn axpy_group<T: Load8>(row: *const T, acc: &mut [f32], ws: &[f32]) {
        let d = acc.len() / ws.len();
        let out = acc.as_mut_ptr();
        for i in (0..d).step_by(8) {
            // SAFETY: i + 8 <= d values of the row and of each head's accumulator.
            unsafe {
                let v = T::load8(row.add(i));
                for (h, &w) in ws.iter().enumerate() {
                    let o = out.add(h * d + i);
                    let wv = _mm256_mul_ps(_mm256_set1_ps(w), v);
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), wv));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Grouped products: a bf16 row and the same row widened to f32 give the same bits; the
    /// scores are within f32 rounding of an f64 product and the weighted sums equal
    /// `axpy`'s bit for bit; at head dims with and without the vector kernels, 1 to 9 heads.
    #[test]
    fn grouped_products_match_per_head_products() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for d in [8, 16, 24, 64, 128, 256] {
            for heads in [1, 2, 3, 4, 5, 8, 9] {
                let qs = values(heads * d, 1);
                let k16: Vec<bf16> = values(d, 2).into_iter().map(bf16::from_f32).collect();
                let k32: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
                let mut from32 = vec![0f32; heads];
                KvRow::F32(&k32).dot_group(&qs, &mut from32);
                let mut from16 = vec![0f32; heads];
                KvRow::Bf16(&k16).dot_group(&qs, &mut from16);
                assert_eq!(bits(&from16), bits(&from32), "scores, d {d}, {heads} heads");
                for (h, &got) in from32.iter().enumerate() {
                    let q = &qs[h * d..(h + 1) * d];
                    let want: f64 = k32
                        .iter()
                        .zip(q)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let mag: f64 = k32
                        .iter()
                        .zip(q)
                        .map(|(&a, &b)| f64::from((a * b).abs()))
                        .sum();
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-6 * mag,
                        "score {h}, d {d}"
                    );
                }

                let ws = values(heads, 3);
                let start = values(heads * d, 4);
                let mut want = start.clone();
                for (h, &w) in ws.iter().enumerate() {
                    axpy(&mut want[h * d..(h + 1) * d], w, &k32);
                }
                for row in [KvRow::F32(&k32), KvRow::Bf16(&k16)] {
                    let mut acc = start.clone();
                    row.axpy_group(&mut acc, &ws);
                    assert_eq!(bits(&acc), bits(&want), "sums, d {d}, {heads} heads");
                }

                // Many rows at once: row by row's bits, for f32, bf16 and mixed rows.
                // Blocks of rows: one, and several (70 rows pass a block at every d).
                for n in [7, 70] {
                    let v32: Vec<Vec<f32>> = (0..n).map(|j| values(d, 10 + j as u32)).collect();
                    let v16: Vec<Vec<bf16>> = v32
                        .iter()
                        .map(|v| v.iter().map(|&x| bf16::from_f32(x)).collect())
                        .collect();
                    let wn = values(heads * n, 5);
                    let kinds: [fn(usize) -> bool; 3] = [|_| true, |_| false, |j| j % 2 == 0];
                    for as_f32 in kinds {
                        let rows: Vec<KvRow<'_>> = (0..n)
                            .map(|j| match as_f32(j) {
                                true => KvRow::F32(&v32[j]),
                                false => KvRow::Bf16(&v16[j]),
                            })
                            .collect();
                        let mut want = start.clone();
                        for (j, row) in rows.iter().enumerate() {
                            let w: Vec<f32> = (0..heads).map(|h| wn[h * n + j]).collect();
                            row.axpy_group(&mut want, &w);
                        }
                        let mut got = start.clone();
                        axpy_rows(&rows, &wn, &mut got);
                        assert_eq!(bits(&got), bits(&want), "{n} rows, d {d}, {heads} heads");
                    }
                }
            }
        }
    }
}
