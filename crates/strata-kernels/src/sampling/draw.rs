//! One draw from a row of logits: the definition every backend's sampler reproduces, written
//! so that a row of a large vocabulary costs about one pass over it.
//!
//! The candidates are the scaled logits `key(x) / temperature` of every id, or the `top_k`
//! best (logit descending, ties to the lower id; a `top_k` at or past the vocabulary keeps
//! every id, sorted). Each weighs `exp(x - max)` in f64. With
//! `top_p`, the nucleus is the shortest prefix of the candidates in that order whose running
//! sum reaches `top_p` times the candidates' total, the total summed in candidate order (id
//! order when there is no `top_k`); with `min_p`, candidates below `min_p` (the largest
//! weighs 1) go. The draw walks the survivors (in id order when nothing filtered them, in
//! the sorted order otherwise) until the running sum passes `u * total`, `u` the request's
//! next `rng.next_f64()`.
//!
//! Nothing here sorts the whole vocabulary unless a nucleus needs it: the best candidates
//! are selected in one pass, a few at first and more only while the nucleus is not reached.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use super::{argmax, by_logit_desc, key, SamplerRng, SamplingParams};
use crate::{KernelError, Result};

/// Candidates selected in the first round of a nucleus search; each later round takes
/// [`NUCLEUS_GROWTH`] times more, and past a quarter of the row the whole row is sorted.
const NUCLEUS_FIRST: usize = 64;
const NUCLEUS_GROWTH: usize = 8;
/// Values a parallel task of the weight pass takes.
const WEIGHT_CHUNK: usize = 16_384;

/// Draws one token id from `logits` (one row of `vocab` values), as the module says.
///
/// Non-greedy draws take exactly one `rng.next_f64()`; greedy takes none.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut SamplerRng) -> Result<u32> {
    params.validate()?;
    if logits.is_empty() {
        return Err(KernelError::Invalid {
            op: "sample",
            detail: "empty logits".into(),
        });
    }
    if params.is_greedy() {
        return Ok(argmax(logits));
    }
    let inv_t = 1.0 / params.temperature;
    let n = logits.len();
    // A top_k of the whole row or more still sorts the candidates (it filters nothing).
    let top_k = (params.top_k > 0).then(|| params.top_k.min(n));
    // The top_k best, sorted; `None`: every id, in id order.
    let best = top_k.map(|k| select_best(logits, inv_t, k));
    let max = match &best {
        Some(b) => b.first().map_or(f32::NEG_INFINITY, |c| c.1),
        None => logits
            .iter()
            .map(|&x| key(x) * inv_t)
            .fold(f32::NEG_INFINITY, f32::max),
    };
    if max == f32::NEG_INFINITY {
        // Every logit is -inf or NaN: nothing to draw from; fall back to the lowest id.
        return Ok(argmax(logits));
    }
    let weight = |x: f32| ((x - max) as f64).exp();
    let (cand, weights) = match best {
        Some(b) => {
            let w: Vec<f64> = b.iter().map(|c| weight(c.1)).collect();
            let (c, w) = nucleus_of_sorted(b, w, params.top_p);
            (Some(c), w)
        }
        None => {
            let all = weights_in_id_order(logits, inv_t, &weight);
            if params.top_p < 1.0 {
                let (c, w) = nucleus_of_row(logits, inv_t, &all, params.top_p, &weight);
                (Some(c), w)
            } else if params.min_p > 0.0 {
                let c = survivors(logits, inv_t, &all, params.min_p as f64);
                let w = c.iter().map(|c| weight(c.1)).collect();
                (Some(c), w)
            } else {
                (None, all)
            }
        }
    };
    let (cand, weights) = match cand {
        Some(mut c) => {
            let mut w = weights;
            if params.min_p > 0.0 {
                // Sorted, so the weights fall along the list; the first weighs 1.
                let keep = w
                    .iter()
                    .take_while(|&&x| x >= params.min_p as f64)
                    .count()
                    .max(1);
                w.truncate(keep);
                c.truncate(keep);
            }
            (Some(c), w)
        }
        None => (None, weights),
    };
    let total: f64 = weights.iter().sum();
    let u = rng.next_f64() * total;
    let id = |i: usize| cand.as_ref().map_or(i as u32, |c| c[i].0);
    let mut cum = 0.0;
    for (i, w) in weights.iter().enumerate() {
        cum += w;
        if u < cum {
            return Ok(id(i));
        }
    }
    // Rounding can leave u a hair above the final sum: the last non-zero candidate.
    let last = weights.iter().rposition(|&w| w > 0.0).unwrap_or(0);
    Ok(id(last))
}

/// Every id's weight, in id order (computed in parallel; each value is the same either way).
fn weights_in_id_order(
    logits: &[f32],
    inv_t: f32,
    weight: &(dyn Fn(f32) -> f64 + Sync),
) -> Vec<f64> {
    let mut w = vec![0.0; logits.len()];
    w.par_chunks_mut(WEIGHT_CHUNK)
        .zip(logits.par_chunks(WEIGHT_CHUNK))
        .for_each(|(w, x)| {
            for (w, &x) in w.iter_mut().zip(x) {
                *w = weight(key(x) * inv_t);
            }
        });
    w
}

/// The `k` best candidates of the row (scaled logit descending, ties to the lower id),
/// sorted, from one pass that keeps the best so far in a heap.
fn select_best(logits: &[f32], inv_t: f32, k: usize) -> Vec<(u32, f32)> {
    if k * 4 >= logits.len() {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, key(x) * inv_t))
            .collect();
        all.sort_unstable_by(by_logit_desc);
        all.truncate(k);
        return all;
    }
    let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
    for (i, &x) in logits.iter().enumerate() {
        let c = (i as u32, key(x) * inv_t);
        if heap.len() < k {
            heap.push(Worst(c));
        } else if by_logit_desc(&c, &heap.peek().expect("k > 0").0) == Ordering::Less {
            heap.pop();
            heap.push(Worst(c));
        }
    }
    let mut best: Vec<(u32, f32)> = heap.into_iter().map(|w| w.0).collect();
    best.sort_unstable_by(by_logit_desc);
    best
}

/// A candidate in a max-heap whose top is the worst kept (the last in candidate order).
struct Worst((u32, f32));

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Worst {}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// The nucleus of sorted candidates `cand` with weights `w`: the shortest prefix whose
/// running sum reaches `top_p` of their total (summed in that order). All of them when
/// `top_p` is 1.
fn nucleus_of_sorted(
    mut cand: Vec<(u32, f32)>,
    mut w: Vec<f64>,
    top_p: f32,
) -> (Vec<(u32, f32)>, Vec<f64>) {
    if top_p < 1.0 {
        let total: f64 = w.iter().sum();
        let keep = prefix_reaching(&w, top_p as f64 * total).unwrap_or(w.len());
        cand.truncate(keep);
        w.truncate(keep);
    }
    (cand, w)
}

/// Candidates of a prefix of `w` (in order) whose running sum reaches `target`: the count,
/// or `None` if the whole of `w` falls short.
fn prefix_reaching(w: &[f64], target: f64) -> Option<usize> {
    let mut cum = 0.0;
    for (i, x) in w.iter().enumerate() {
        if i > 0 && cum >= target {
            return Some(i);
        }
        cum += x;
    }
    (cum >= target).then_some(w.len())
}

/// The nucleus of the whole row: its total summed in id order, the prefix taken in sorted
/// order from the best candidates, selected a few at first and more while the prefix falls
/// short.
fn nucleus_of_row(
    logits: &[f32],
    inv_t: f32,
    all: &[f64],
    top_p: f32,
    weight: &dyn Fn(f32) -> f64,
) -> (Vec<(u32, f32)>, Vec<f64>) {
    let total: f64 = all.iter().sum();
    let target = top_p as f64 * total;
    let mut m = NUCLEUS_FIRST.min(logits.len());
    loop {
        let mut best = select_best(logits, inv_t, m);
        let mut w: Vec<f64> = best.iter().map(|c| weight(c.1)).collect();
        let reached = prefix_reaching(&w, target);
        if let Some(keep) = reached.filter(|&k| k < m || m == logits.len()) {
            best.truncate(keep);
            w.truncate(keep);
            return (best, w);
        }
        if m == logits.len() {
            // Rounding kept the whole row short of the target: all of it.
            return (best, w);
        }
        m = (m * NUCLEUS_GROWTH).min(logits.len());
    }
}

/// The candidates weighing at least `threshold`, sorted.
fn survivors(logits: &[f32], inv_t: f32, all: &[f64], threshold: f64) -> Vec<(u32, f32)> {
    let mut c: Vec<(u32, f32)> = all
        .iter()
        .enumerate()
        .filter(|(_, &w)| w >= threshold)
        .map(|(i, _)| (i as u32, key(logits[i]) * inv_t))
        .collect();
    c.sort_unstable_by(by_logit_desc);
    c
}
