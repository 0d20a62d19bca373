//! The sampler's seeded random source.
//!
//! xoshiro256** (Blackman and Vigna) seeded through splitmix64: small, fast, statistically
//! sound for sampling, and fully specified here so a device sampler or another language can
//! reproduce the exact stream (same seed -> same tokens, on any backend).

/// xoshiro256** state. `Clone` copies the stream position (useful to replay a draw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerRng {
    s: [u64; 4],
}

/// One splitmix64 step: advances `state` and returns the mixed output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform of the draw of token `index` of a request seeded with `seed`: output number
/// `index` of the splitmix64 sequence from `seed`, computed directly (a counter, not a
/// stream, so nothing is advanced or has to be rolled back).
pub fn draw_uniform(seed: u64, index: u64) -> u64 {
    let mut state = seed.wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    splitmix64(&mut state)
}

impl SamplerRng {
    /// The state is four consecutive splitmix64 outputs from `seed` (never all zero).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        Self {
            s: [
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
            ],
        }
    }

    /// The next 64 bits of the xoshiro256** stream.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_published_first_outputs() {
        // Reference values of splitmix64 seeded with 1234567.
        let mut s = 1234567u64;
        assert_eq!(splitmix64(&mut s), 6457827717110365317);
        assert_eq!(splitmix64(&mut s), 3203168211198807973);
    }

    #[test]
    fn draw_uniform_is_the_splitmix64_sequence() {
        let mut s = 1234567u64;
        let seq: Vec<u64> = (0..5).map(|_| splitmix64(&mut s)).collect();
        let direct: Vec<u64> = (0..5).map(|i| draw_uniform(1234567, i)).collect();
        assert_eq!(seq, direct);
    }

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let a: Vec<u64> = {
            let mut r = SamplerRng::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let mut r = SamplerRng::new(42);
        let b: Vec<u64> = (0..8).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        let mut r = SamplerRng::new(43);
        let c: Vec<u64> = (0..8).map(|_| r.next_u64()).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_is_in_range_and_roughly_uniform() {
        let mut r = SamplerRng::new(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.01);
    }
}
