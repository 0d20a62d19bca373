//! Drift verification of weight refreshes: the served copy is perturbed in place (as a
//! training step would change it), then refreshed from the checkpoint the way a weight
//! update serves new weights (a second copy loaded, checked against the served shapes, its
//! adapters carried over, swapped in). After each refresh the served weights must be
//! bit-identical to a fresh load (a digest per tensor) and greedy output identical.

use std::path::Path;

use strata_kv::{CacheType, KvLayout, KvPool, PagePlan};
use strata_model::{ForwardBatch, KvCache, LoadOptions, LogitsMode, Model, SeqChunk};

use crate::{EngineError, LoadedModel, OnBackend, OnDevice, Placement, Result};

/// One perturb-and-refresh cycle.
#[derive(Clone, Debug, PartialEq)]
pub struct DriftCycle {
    /// The factor every dense matrix was multiplied by.
    pub factor: f32,
    /// Tensors whose digest the perturbation changed (none: it did nothing).
    pub perturbed_tensors: usize,
    /// Whether the perturbed weights' greedy tokens differed from the checkpoint's.
    pub perturbed_output_differs: bool,
    /// Tensors whose digest differs from a fresh load's after the refresh (0 to pass).
    pub drifted_tensors: usize,
    /// Whether the refreshed weights' greedy tokens equal the checkpoint's.
    pub output_identical: bool,
}

/// What [`verify_drift`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct DriftReport {
    /// Tensors compared each cycle.
    pub tensors: usize,
    /// The greedy tokens of a fresh load.
    pub reference_tokens: Vec<u32>,
    /// Each cycle, in order.
    pub cycles: Vec<DriftCycle>,
}

impl DriftReport {
    /// Every cycle perturbed the weights and restored them exactly, output included.
    pub fn passed(&self) -> bool {
        !self.cycles.is_empty()
            && self
                .cycles
                .iter()
                .all(|c| c.perturbed_tensors > 0 && c.drifted_tensors == 0 && c.output_identical)
    }
}

/// Runs `cycles` perturb-and-refresh cycles on `loaded`'s model, generating `tokens` greedy
/// tokens after `prompt` to compare outputs.
pub fn verify_drift(
    loaded: &LoadedModel,
    cycles: usize,
    prompt: &[u32],
    tokens: usize,
) -> Result<DriftReport> {
    if prompt.is_empty() || tokens == 0 {
        return Err(EngineError::Invalid(
            "drift verification needs a prompt and tokens to generate".into(),
        ));
    }
    loaded.runtime.dispatch(Drift {
        path: loaded.path(),
        opts: loaded.load_options(),
        cycles,
        prompt,
        tokens,
    })
}

struct Drift<'a> {
    path: &'a Path,
    opts: LoadOptions,
    cycles: usize,
    prompt: &'a [u32],
    tokens: usize,
}

impl OnBackend for Drift<'_> {
    type Output = Result<DriftReport>;

    fn run<B: Placement>(self, placed: &OnDevice<B>) -> Self::Output
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        let fresh = &placed.model;
        let want = fresh.weight_digests()?;
        let greedy = |m: &Model<B>| greedy_tokens(m, self.prompt, self.tokens);
        let reference_tokens = greedy(fresh)?;
        let load = || Model::load_with(fresh.backend().clone(), self.path, self.opts.clone());
        let mut served = load()?;
        let mut cycles = Vec::with_capacity(self.cycles);
        for c in 1..=self.cycles {
            let factor = 1.0 + 0.25 * c as f32;
            served.perturb_weights(factor)?;
            let perturbed_tensors = differing(&served.weight_digests()?, &want);
            let perturbed_output_differs = greedy(&served)? != reference_tokens;
            // The refresh, as a weight update serves new weights.
            let copy = load()?;
            served.check_same_shapes(&copy)?;
            copy.adopt_loras(&served);
            served = copy;
            cycles.push(DriftCycle {
                factor,
                perturbed_tensors,
                perturbed_output_differs,
                drifted_tensors: differing(&served.weight_digests()?, &want),
                output_identical: greedy(&served)? == reference_tokens,
            });
        }
        Ok(DriftReport {
            tensors: want.len(),
            reference_tokens,
            cycles,
        })
    }
}

/// Tensors whose digest differs between `a` and `b` (the same tensors in the same order).
fn differing(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

/// `n` greedy tokens after `prompt`, on a pool of the model's own.
fn greedy_tokens<B: Placement>(model: &Model<B>, prompt: &[u32], n: usize) -> Result<Vec<u32>>
where
    KvPool<B::Storage>: KvCache<B>,
{
    let layout = KvLayout::for_config(model.config(), strata_kv::KvCacheDtype::Auto)?;
    let page = 16;
    let pages = (prompt.len() + n).div_ceil(page) + 1;
    let plan = PagePlan {
        full: pages,
        window: pages,
        page_size: page,
    };
    let mut kv = KvPool::new(layout, plan, CacheType::Naive, B::kv_storage(model))?;
    let req = kv.alloc_request();
    let mut out = Vec::with_capacity(n);
    let mut chunk = prompt.to_vec();
    let mut start = 0;
    while out.len() < n {
        kv.extend(req, chunk.len())?;
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                request: req,
                tokens: chunk.clone(),
                start,
                logits: LogitsMode::Argmax,
            }],
            ..ForwardBatch::default()
        };
        let step = model.forward(&mut kv, &batch)?;
        let token = step
            .tokens
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| EngineError::Internal("a greedy step gave no token".into()))?;
        out.push(token);
        start += chunk.len();
        chunk = vec![token];
    }
    kv.release(req)?;
    Ok(out)
}
