//! Pieces shared by the K-quant formats (256-value super-blocks).

use super::BlockQ8K;

/// Unpacks the 12-byte scale/min field of Q4_K and Q5_K into eight 6-bit scales and eight
/// 6-bit mins. Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4; the
/// low/high nibbles of bytes 8..12 hold the low 4 bits of scales/mins 4..8, whose top 2 bits
/// sit in the top 2 bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline]
pub(super) fn unpack_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// Inverse of [`unpack_scales_mins`]; every input must be below 64.
pub(super) fn pack_scales_mins(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
    s
}

/// `sum_g (d * scale[g]) * sum(q * x) - (dmin * min[g]) * sum(x)` over groups of `GROUP`
/// values: the f32 dot product of every "scale times code minus min" K-quant.
#[inline]
pub(super) fn dot_affine<const GROUP: usize>(
    codes: &[u8; 256],
    scales: &[u8],
    mins: &[u8],
    d: f32,
    dmin: f32,
    x: &[f32],
) -> f32 {
    let mut acc = 0.0f32;
    for (g, (q, x)) in codes
        .chunks_exact(GROUP)
        .zip(x[..256].chunks_exact(GROUP))
        .enumerate()
    {
        let qx: f32 = q.iter().zip(x).map(|(&q, &x)| f32::from(q) * x).sum();
        let sx: f32 = x.iter().sum();
        acc += d * f32::from(scales[g]) * qx - dmin * f32::from(mins[g]) * sx;
    }
    acc
}

/// `sum_g (d * scale[g]) * sum(q * x)` for the symmetric K-quants (signed codes).
#[inline]
pub(super) fn dot_symmetric<const GROUP: usize>(
    codes: &[i8; 256],
    scales: &[i8],
    d: f32,
    x: &[f32],
) -> f32 {
    let mut acc = 0.0f32;
    for (g, (q, x)) in codes
        .chunks_exact(GROUP)
        .zip(x[..256].chunks_exact(GROUP))
        .enumerate()
    {
        let qx: f32 = q.iter().zip(x).map(|(&q, &x)| f32::from(q) * x).sum();
        acc += f32::from(scales[g]) * qx;
    }
    acc * d
}

/// Integer part of the affine dot against Q8_K: returns `(sum_g scale*isum_g, sum_g min*bsum_g)`.
#[inline]
pub(super) fn idot_affine<const GROUP: usize>(
    codes: &[u8; 256],
    scales: &[u8],
    mins: &[u8],
    a: &BlockQ8K,
) -> (i32, i32) {
    let mut sq = 0i32;
    let mut sm = 0i32;
    for (g, (q, x)) in codes
        .chunks_exact(GROUP)
        .zip(a.qs.chunks_exact(GROUP))
        .enumerate()
    {
        let isum: i32 = q
            .iter()
            .zip(x)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        sq += i32::from(scales[g]) * isum;
        sm += i32::from(mins[g]) * a.group_sum::<GROUP>(g);
    }
    (sq, sm)
}

/// Integer part of the symmetric dot against Q8_K: `sum_g scale*isum_g`.
#[inline]
pub(super) fn idot_symmetric<const GROUP: usize>(
    codes: &[i8; 256],
    scales: &[i8],
    a: &BlockQ8K,
) -> i32 {
    let mut s = 0i32;
    for (g, (q, x)) in codes
        .chunks_exact(GROUP)
        .zip(a.qs.chunks_exact(GROUP))
        .enumerate()
    {
        let isum: i32 = q
            .iter()
            .zip(x)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        s += i32::from(scales[g]) * isum;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        let sc = [0, 1, 17, 63, 32, 5, 48, 62];
        let mn = [63, 2, 33, 0, 16, 47, 9, 31];
        let packed = pack_scales_mins(&sc, &mn);
        assert_eq!(unpack_scales_mins(&packed), (sc, mn));
        // The layout itself: scale 4 = low nibble of byte 8 | top bits of byte 0.
        assert_eq!(packed[8] & 15, 32 & 15);
        assert_eq!(packed[0] >> 6, 32 >> 4);
    }
}
