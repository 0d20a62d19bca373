//! One draw from a row of logits: the definition every backend's sampler reproduces to the
//! bit (`weight.rs` has its arithmetic), written so that a row of a large vocabulary costs
//! about one pass over it.
//!
//! Each id's scaled value is `s = key(x) / temperature` ([`scaled`]); its weight is
//! `W = floor(exp(s - max) * 2^shift)`, an integer ([`fixed_weight`]), so the best weighs
//! `2^shift` and every total is exact. The rank order is `s` descending, ties to the lower
//! id. With no filter, the draw walks the ids in id order until the running total passes
//! `floor(T * u / 2^53)`, `T` the row's total and `u` the top 53 bits of the draw's
//! uniform. With filters it walks the rank order, over its first `n` candidates, `n` the
//! smallest of:
//! - `top_k`;
//! - with `top_p`, the shortest prefix whose total reaches `floor(T_k * top_p32 / 2^32)`,
//!   `T_k` the total of the first `top_k` (of the row without top-k);
//! - with `min_p`, the candidates whose `s - max` is at least `ln(min_p)` (that is, whose
//!   probability is at least `min_p` times the best's).
//!
//! Nothing here sorts the whole vocabulary unless a nucleus needs it: the best candidates
//! are selected in one pass, a few at first and more only while the nucleus is not reached.
//! Candidates weighing 0 can neither be drawn nor change a total, so only the `live` ones
//! (`s - max` at least [`WEIGHT_CUTOFF`], a prefix of the rank order) are ever selected.

use std::collections::BinaryHeap;

use rayon::prelude::*;

use super::weight::{
    fixed_weight, mul_shr, rank, relative, scaled, uniform_bits, weight_shift, with_fma,
    DrawSettings, WEIGHT_CUTOFF,
};
use super::{argmax, SamplingParams};
use crate::error::Result;
use crate::SamplingError;

/// Candidates selected in the first round of a nucleus search; each later round takes
/// [`NUCLEUS_GROWTH`] times more, and past a quarter of the row the whole row is sorted.
const NUCLEUS_FIRST: usize = 64;
const NUCLEUS_GROWTH: usize = 8;
/// Values a parallel task of a pass over the row takes.
const CHUNK: usize = 16_384;

/// Draws one token id from `logits` (one row of `vocab` values) with the draw's 64-bit
/// `uniform`, as the module says. Greedy settings return the argmax and ignore `uniform`.
pub fn sample(logits: &[f32], params: &SamplingParams, uniform: u64) -> Result<u32> {
    params.validate()?;
    if logits.is_empty() {
        return Err(SamplingError::Invalid {
            op: "sample",
            detail: "empty logits".into(),
        });
    }
    if params.is_greedy() {
        return Ok(argmax(logits));
    }
    let set = DrawSettings::new(params);
    let inv_t = set.inv_t;
    let max = logits
        .par_chunks(CHUNK)
        .map(|c| {
            c.iter()
                .map(|&x| scaled(x, inv_t))
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .reduce(|| f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // Every logit is -inf or NaN: nothing to draw from; the lowest id, as greedy has it.
        return Ok(argmax(logits));
    }
    let row = Row {
        logits,
        inv_t,
        max,
        shift: weight_shift(logits.len()),
    };
    let u = uniform_bits(uniform);
    let id = if set.filtered() {
        row.draw_ranked(&set, u)
    } else {
        row.draw_in_id_order(u)
    };
    Ok(id.unwrap_or_else(|| argmax(logits)))
}

/// A row with its best scaled value.
struct Row<'a> {
    logits: &'a [f32],
    inv_t: f32,
    max: f32,
    shift: u32,
}

impl Row<'_> {
    fn rel(&self, x: f32) -> f32 {
        relative(scaled(x, self.inv_t), self.max)
    }

    fn weight(&self, x: f32) -> u64 {
        fixed_weight(self.rel(x), self.shift)
    }

    /// The first id, in id order, whose running total passes `floor(T * u / 2^53)`.
    /// (`None` cannot happen: the target is below the total.)
    fn draw_in_id_order(&self, u: u64) -> Option<u32> {
        let sums: Vec<u64> = self
            .logits
            .par_chunks(CHUNK)
            .map(|c| with_fma(|| c.iter().map(|&x| self.weight(x)).sum()))
            .collect();
        let target = mul_shr(sums.iter().sum(), u, 53);
        let mut cum = 0u64;
        for (c, &sum) in sums.iter().enumerate() {
            if cum + sum > target {
                for (j, &x) in self.logits[c * CHUNK..].iter().take(CHUNK).enumerate() {
                    cum += self.weight(x);
                    if cum > target {
                        return Some((c * CHUNK + j) as u32);
                    }
                }
            }
            cum += sum;
        }
        None
    }

    /// The draw over the rank order's first candidates, as the module says.
    fn draw_ranked(&self, set: &DrawSettings, u: u64) -> Option<u32> {
        let n = self.logits.len();
        let min_rel = set.min_rel.unwrap_or(f32::NEG_INFINITY);
        // (live, kept by min_p, total weight), in one parallel pass.
        let (live, kept_min, total) = self
            .logits
            .par_chunks(CHUNK)
            .map(|c| {
                with_fma(|| {
                    c.iter().fold((0usize, 0usize, 0u64), |(l, m, t), &x| {
                        let d = self.rel(x);
                        let w = fixed_weight(d, self.shift);
                        (
                            l + usize::from(d >= WEIGHT_CUTOFF),
                            m + usize::from(d >= min_rel),
                            t + w,
                        )
                    })
                })
            })
            .reduce(|| (0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        let top_k = if set.top_k > 0 { set.top_k.min(n) } else { n };
        // Past the live candidates every weight is 0: no count beyond them changes a total
        // or the draw.
        let (n_k, n_m) = (top_k.min(live), kept_min.min(live));
        let mut m = match (set.top_k > 0, set.top_p32.is_some()) {
            (true, _) => n_k,
            (false, true) => NUCLEUS_FIRST.min(n_k),
            (false, false) => n_m,
        };
        loop {
            let best = self.select_best(m);
            let mut cum = Vec::with_capacity(best.len());
            let mut run = 0u64;
            for &c in &best {
                run += self.weight(self.logits[(c & 0xffff_ffff) as usize]);
                cum.push(run);
            }
            let n_p = match set.top_p32 {
                Some(p32) => {
                    let t_k = if set.top_k > 0 { run } else { total };
                    let target = mul_shr(t_k, p32, 32);
                    match cum.iter().position(|&c| c >= target) {
                        Some(i) => i + 1,
                        None if m < n_k => {
                            m = (m * NUCLEUS_GROWTH).min(n_k);
                            continue;
                        }
                        None => n_k,
                    }
                }
                None => n_k,
            };
            let keep = n_k.min(n_p).min(n_m).min(best.len());
            let target = mul_shr(*cum.get(keep.checked_sub(1)?)?, u, 53);
            let i = cum[..keep].iter().position(|&c| c > target)?;
            return Some((best[i] & 0xffff_ffff) as u32);
        }
    }

    /// The `m` first candidates in rank order, as `(rank << 32) | id`, sorted.
    fn select_best(&self, m: usize) -> Vec<u64> {
        let candidate =
            |(i, &x): (usize, &f32)| ((rank(scaled(x, self.inv_t)) as u64) << 32) | i as u64;
        if m * 4 >= self.logits.len() {
            let mut all: Vec<u64> = self.logits.iter().enumerate().map(candidate).collect();
            all.sort_unstable();
            all.truncate(m);
            return all;
        }
        // A max-heap whose top is the worst kept.
        let mut heap: BinaryHeap<u64> = BinaryHeap::with_capacity(m + 1);
        for c in self.logits.iter().enumerate().map(candidate) {
            if heap.len() < m {
                heap.push(c);
            } else if c < *heap.peek().expect("m > 0") {
                heap.pop();
                heap.push(c);
            }
        }
        heap.into_sorted_vec()
    }
}
