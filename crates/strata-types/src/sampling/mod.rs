//! Token sampling: greedy, temperature, top-k, top-p, min-p, seeded.
//!
//! [`sample`] is the definition of a draw for every backend (`draw.rs`): a backend's
//! `strata_kernels::Backend::pick_start` draws the same token from the same logits and uniform, to
//! the bit. Order of the filters follows transformers' logits warpers: temperature, then
//! top-k, then top-p (on the distribution renormalised over the top-k survivors), then min-p
//! (which keeps `p >= min_p * p_max`; it commutes with the truncations above because they
//! all keep the most likely token and renormalising keeps probability ratios).
//!
//! A draw's randomness is one 64-bit uniform; a request's draws take theirs from
//! [`draw_uniform`] by the index of the token drawn, so a token depends on the request's
//! seed and its position alone (not on batching, preemption or steps planned ahead).

pub mod adjust;
mod draw;
mod logprobs;
mod rng;
pub mod weight;

pub use adjust::{
    adjust_logits, adjust_rows, check_rows, mask_rows, LogitControls, RowAdjust, RowMask,
    TokenCounts,
};
pub use draw::sample;
pub use logprobs::{
    log_softmax, logprob_of, logprob_value, token_logprobs, top_logprobs, top_values, RowMass,
    TokenLogprobs, MAX_TOP_LOGPROBS,
};
pub use rng::{draw_uniform, SamplerRng};

use crate::error::Result;
use crate::SamplingError;

/// Per-request sampling settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, ties to the lowest id, no random draw).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest most-likely prefix whose mass reaches `top_p`; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens with `p < min_p * p_max`; 0.0 disables.
    pub min_p: f32,
    /// Seed of this request's draws ([`draw_uniform`]); without one the scheduler picks one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Greedy settings: temperature 0 and every filter off, no seed.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }

    /// Whether these settings always take the argmax (temperature 0 or `top_k` of 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// `Err` naming the setting that is out of its range.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(SamplingError::Invalid {
                op: "sample",
                detail,
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p {} must be in [0, 1]", self.min_p));
        }
        Ok(())
    }
}

impl SamplingParams {
    /// The seed of a request's draws: its own if it gave one, else `fallback_seed` (e.g.
    /// drawn by the server per request).
    pub fn seed_or(&self, fallback_seed: u64) -> u64 {
        self.seed.unwrap_or(fallback_seed)
    }
}

/// A row of a step's logits drawn from where the logits are (`strata_kernels::Backend::pick_start`):
/// its index, settings and the draw's uniform.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowDraw {
    /// Index of the row in the step's logits.
    pub row: usize,
    /// The sampling settings of the draw.
    pub params: SamplingParams,
    /// The draw's 64-bit uniform ([`draw_uniform`]).
    pub uniform: u64,
    /// Also the token's logprob and this many top logprobs ([`token_logprobs`]).
    pub logprobs: Option<usize>,
}

/// A row's token, with its logprobs where its [`RowDraw`] asked for them.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    /// The token id picked.
    pub id: u32,
    /// The token's logprobs, if the row's draw asked for them.
    pub logprobs: Option<TokenLogprobs>,
}

/// NaN sorts as -inf so a broken logit can never be chosen over a real one.
#[inline]
fn key(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The `k` highest of `scores` (NaN as -inf; ties, -0 with +0 among them, to the lower
/// index), best first.
pub fn top_clusters(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    let v = |i: usize| key(scores[i]);
    order.sort_by(|&i, &j| {
        v(j).partial_cmp(&v(i))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(i.cmp(&j))
    });
    order.truncate(k);
    order
}

/// The greedy token of a clustered output head (Gemma-4's assistant): the largest logit
/// among the tokens of the `top_k` clusters whose `scores` are highest ([`top_clusters`]);
/// `ordering` lists the token ids cluster by cluster, `ordering.len() / scores.len()` each.
/// Ties go to the lowest id, NaN never wins (as [`argmax`]).
pub fn clustered_argmax(logits: &[f32], scores: &[f32], ordering: &[u32], top_k: usize) -> u32 {
    let per = ordering.len() / scores.len().max(1);
    let (mut best, mut best_v) = (u32::MAX, f32::NEG_INFINITY);
    for c in top_clusters(scores, top_k) {
        for &t in &ordering[c * per..(c + 1) * per] {
            let x = key(logits[t as usize]);
            if x > best_v || (x == best_v && t < best) {
                best = t;
                best_v = x;
            }
        }
    }
    best
}

/// Index of the largest logit; ties go to the lowest id, NaN never wins.
///
/// Two passes that vectorize, as a decode step runs this over a whole vocabulary: the
/// largest value (NaN never compares greater), then the first index holding it (-0 and +0
/// compare equal, so a zero maximum finds the first zero of either sign, as one pass would).
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    const CHUNK: usize = 256;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let whole = logits.chunks_exact(LANES);
    let tail = whole.remainder();
    for c in whole {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut best_v = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(tail) {
        best_v = if x > best_v { x } else { best_v };
    }
    if best_v == f32::NEG_INFINITY {
        return 0;
    }
    for (k, c) in logits.chunks(CHUNK).enumerate() {
        if c.iter().fold(false, |hit, &x| hit | (x == best_v)) {
            let i = c.iter().position(|&x| x == best_v).unwrap_or(0);
            return (k * CHUNK + i) as u32;
        }
    }
    0
}

/// A token id that stands for a greedy token not yet read back: `FED_TOKEN | r` is row
/// `r` of an earlier step's argmax (`strata_kernels::Backend::feed_tokens`). Vocabularies stay
/// below 2^31 ids, so no real id has this bit.
pub const FED_TOKEN: u32 = 1 << 31;

/// The host definition of `strata_kernels::Backend::feed_tokens`: every id marked with
/// [`FED_TOKEN`] becomes row `id & !FED_TOKEN` of `greedy` (id 0 past its rows).
pub fn feed_tokens(ids: &mut [u32], greedy: &[u32]) {
    for id in ids.iter_mut().filter(|id| **id & FED_TOKEN != 0) {
        *id = greedy
            .get((*id & !FED_TOKEN) as usize)
            .copied()
            .unwrap_or(0);
    }
}

/// The host definition of `strata_kernels::Backend::pick_start`: every row's argmax, except the
/// rows of `draws`, each drawn with [`sample`] (greedy settings keep the argmax), and with
/// [`token_logprobs`] where a draw asks for them.
pub fn pick_rows(
    logits: &[f32],
    vocab: usize,
    rows: usize,
    draws: &[RowDraw],
) -> Result<Vec<Picked>> {
    if vocab == 0 || logits.len() < rows * vocab {
        return Err(SamplingError::Shape {
            op: "pick_rows",
            detail: format!("logits {} for {rows} rows of {vocab}", logits.len()),
        });
    }
    let row = |r: usize| &logits[r * vocab..(r + 1) * vocab];
    let mut picks: Vec<Picked> = (0..rows)
        .map(|r| Picked {
            id: argmax(row(r)),
            logprobs: None,
        })
        .collect();
    for d in draws {
        if d.row >= rows {
            return Err(SamplingError::Shape {
                op: "pick_rows",
                detail: format!("a draw for row {} of {rows}", d.row),
            });
        }
        let pick = &mut picks[d.row];
        pick.id = sample(row(d.row), &d.params, d.uniform)?;
        pick.logprobs = d.logprobs.map(|n| token_logprobs(row(d.row), pick.id, n));
    }
    Ok(picks)
}

/// The ids of [`pick_rows`]'s picks.
pub fn pick_ids(picks: &[Picked]) -> Vec<u32> {
    picks.iter().map(|p| p.id).collect()
}

#[cfg(test)]
mod tests;
