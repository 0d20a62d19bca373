//! Token sampling on host logits: greedy, temperature, top-k, top-p, min-p, seeded.
//!
//! This is the definition of sampling for every backend ([`crate::Backend::sample`] defaults
//! to it). Order of the filters follows transformers' logits warpers: temperature, then
//! top-k, then top-p (on the distribution renormalised over the top-k survivors), then min-p
//! (which keeps `p >= min_p * p_max`; it commutes with the truncations above because they
//! all keep the most likely token and renormalising keeps probability ratios).

mod draw;
mod logprobs;
mod rng;

pub use draw::sample;
pub use logprobs::{log_softmax, logprob_of, top_logprobs};
pub use rng::SamplerRng;

use crate::{KernelError, Result};
use std::cmp::Ordering;

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
    /// Seed for this request's [`SamplerRng`] (`SamplerRng::for_request`).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(KernelError::Invalid {
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

impl SamplerRng {
    /// The stream for one request: its own seed if it gave one, else `fallback_seed`
    /// (e.g. drawn by the server per request).
    pub fn for_request(params: &SamplingParams, fallback_seed: u64) -> Self {
        Self::new(params.seed.unwrap_or(fallback_seed))
    }
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

/// Descending by logit, ties by ascending id: the one candidate order.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    key(b.1)
        .partial_cmp(&key(a.1))
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// Index of the largest logit; ties go to the lowest id, NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        let x = key(x);
        if x > best_v {
            best = i;
            best_v = x;
        }
    }
    best as u32
}

/// A token id that stands for a greedy token not yet read back: `FED_TOKEN | r` is row
/// `r` of an earlier step's argmax ([`crate::Backend::feed_tokens`]). Vocabularies stay
/// below 2^31 ids, so no real id has this bit.
pub const FED_TOKEN: u32 = 1 << 31;

/// The host definition of [`crate::Backend::feed_tokens`]: every id marked with
/// [`FED_TOKEN`] becomes row `id & !FED_TOKEN` of `greedy` (id 0 past its rows).
pub fn feed_tokens(ids: &mut [u32], greedy: &[u32]) {
    for id in ids.iter_mut().filter(|id| **id & FED_TOKEN != 0) {
        *id = greedy
            .get((*id & !FED_TOKEN) as usize)
            .copied()
            .unwrap_or(0);
    }
}

/// [`sample`] for each row of `logits [rows, vocab]`.
pub fn sample_rows(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
    rngs: &mut [SamplerRng],
) -> Result<Vec<u32>> {
    let rows = params.len();
    if vocab == 0 || logits.len() != rows * vocab || rngs.len() != rows {
        return Err(KernelError::Shape {
            op: "sample",
            detail: format!(
                "logits {} for {rows} rows of {vocab}; {} rngs",
                logits.len(),
                rngs.len()
            ),
        });
    }
    logits
        .chunks_exact(vocab)
        .zip(params)
        .zip(rngs.iter_mut())
        .map(|((row, p), rng)| sample(row, p, rng))
        .collect()
}

#[cfg(test)]
mod tests;
