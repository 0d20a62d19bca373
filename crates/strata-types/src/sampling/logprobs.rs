//! Log-probabilities of the raw (unwarped) distribution, as OpenAI-style `logprobs` report:
//! temperature and filters do not change them; the model's final softcap does, since it is
//! part of the logits.
//!
//! The normaliser is summed in the draw's fixed point (`weight.rs`): each value weighs
//! `floor(e^(x - best) * 2^shift)`, so the row's total is an integer that any backend
//! computes to the bit in any order, and `ln` of it is taken on the host. A backend
//! therefore sends back the row's best value, that total and the values it reports
//! (`RowMass`, [`TokenLogprobs::from_values`]), and the host turns them into the same
//! logprobs as [`token_logprobs`] gives. Values more than 40 below the best weigh 0: each
//! would move the normaliser by less than e^-40 of the best's share.

use rayon::prelude::*;

use super::weight::{fixed_weight, rank, relative, scaled, weight_shift, with_fma};

/// Top logprobs a backend reports at most for one token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token's logprob and the row's most likely tokens with theirs, most likely first (ties
/// by ascending id).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The logprob of the token drawn.
    pub logprob: f32,
    /// The most likely tokens as `(id, logprob)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What the logprobs of a row need besides its values: the best value (NaN as -inf, -0 as
/// +0) and the fixed-point total of every value's weight relative to it (0 when every
/// value is -inf or NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowMass {
    /// The row's largest value (NaN as -inf, -0 as +0).
    pub best: f32,
    /// Sum of every value's fixed-point weight `floor(e^(x - best) * 2^shift)`.
    pub total: u64,
    /// The fixed-point bits of the weights: `weight_shift(vocab)`.
    pub shift: u32,
}

impl RowMass {
    /// The mass of a row of logits.
    pub fn of(row: &[f32]) -> Self {
        let best = row
            .iter()
            .map(|&x| scaled(x, 1.0))
            .fold(f32::NEG_INFINITY, f32::max);
        let shift = weight_shift(row.len());
        let total = if best == f32::NEG_INFINITY {
            0
        } else {
            // Integer sums: the chunks' order changes nothing.
            row.par_chunks(16_384)
                .map(|c| {
                    with_fma(|| {
                        c.iter()
                            .map(|&x| fixed_weight(relative(scaled(x, 1.0), best), shift))
                            .sum::<u64>()
                    })
                })
                .sum()
        };
        Self { best, total, shift }
    }

    /// `ln(sum of e^x)` over the row: the best value plus the log of the total, whose
    /// fixed point is taken out in f64.
    pub fn log_sum_exp(&self) -> f64 {
        if self.total == 0 {
            return self.best as f64;
        }
        self.best as f64 + ((self.total as f64).ln() - self.shift as f64 * std::f64::consts::LN_2)
    }
}

/// The logprob of a value (NaN as -inf) given the row's `log_sum_exp`.
#[inline]
pub fn logprob_value(x: f32, log_sum_exp: f64) -> f32 {
    (scaled(x, 1.0) as f64 - log_sum_exp) as f32
}

impl TokenLogprobs {
    /// The logprobs from what a backend computed where the logits are: the row's mass, the
    /// token's value, and the top candidates' (id, value) in order.
    pub fn from_values(mass: &RowMass, token_value: f32, top: &[(u32, f32)]) -> Self {
        let lse = mass.log_sum_exp();
        Self {
            logprob: logprob_value(token_value, lse),
            top: top
                .iter()
                .map(|&(id, x)| (id, logprob_value(x, lse)))
                .collect(),
        }
    }
}

/// `x_i - logsumexp(x)` for every entry.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let lse = RowMass::of(logits).log_sum_exp();
    logits.iter().map(|&x| logprob_value(x, lse)).collect()
}

/// Log-probability of one token.
pub fn logprob_of(logits: &[f32], id: u32) -> f32 {
    logprob_value(logits[id as usize], RowMass::of(logits).log_sum_exp())
}

/// The ids of the `n` largest values (NaN as -inf; ties by ascending id), in that order,
/// with their values.
pub fn top_values(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    // The draw's candidate order: (rank of the value, id) ascending; every key is distinct.
    let key = |i: usize| (rank(scaled(logits[i], 1.0)) as u64) << 32 | i as u64;
    let keys: Vec<u64> = if n <= SMALL_TOP {
        // Each chunk keeps its n smallest keys (most values fail one comparison), then the
        // chunks' lists are merged.
        logits
            .par_chunks(TOP_CHUNK)
            .enumerate()
            .map(|(c, chunk)| {
                let mut top: Vec<u64> = Vec::with_capacity(n + 1);
                for j in 0..chunk.len() {
                    let k = key(c * TOP_CHUNK + j);
                    if top.len() < n || k < top[n - 1] {
                        top.insert(top.partition_point(|&t| t < k), k);
                        top.truncate(n);
                    }
                }
                top
            })
            .reduce(Vec::new, |a, b| {
                let mut m: Vec<u64> = a.into_iter().chain(b).collect();
                m.sort_unstable();
                m.truncate(n);
                m
            })
    } else {
        let mut all: Vec<u64> = (0..logits.len()).map(key).collect();
        if n < all.len() {
            all.select_nth_unstable(n - 1);
            all.truncate(n);
        }
        all.sort_unstable();
        all
    };
    keys.into_iter()
        .map(|k| {
            let id = k as u32;
            (id, scaled(logits[id as usize], 1.0))
        })
        .collect()
}

/// Top lists up to this long are kept per chunk while the row is read; longer ones select
/// over a copy of the whole row.
const SMALL_TOP: usize = 64;
/// Values a chunk of [`top_values`]' parallel pass holds.
const TOP_CHUNK: usize = 16_384;

/// The `n` most likely tokens with their log-probabilities, most likely first (ties by
/// ascending id).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    token_logprobs(logits, 0, n).top
}

/// Token `id`'s logprob and the row's `n` top logprobs: the definition every backend's
/// `strata_kernels::Backend::pick_start` reproduces to the bit.
pub fn token_logprobs(logits: &[f32], id: u32, n: usize) -> TokenLogprobs {
    let value = logits.get(id as usize).copied().unwrap_or(f32::NAN);
    TokenLogprobs::from_values(&RowMass::of(logits), value, &top_values(logits, n))
}
