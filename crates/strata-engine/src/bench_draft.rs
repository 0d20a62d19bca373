//! What a speculative round costs at one request: the drafter's steps and the target's
//! verification of them, beside a plain decode step at the same depth. How many drafts a
//! round keeps depends on the weights (random weights keep almost none), so the benchmark
//! reports the costs and the rate each number of kept drafts would give.

use std::time::Instant;

use strata_kernels::{Backend, HostSlice};
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{
    Assistant, DraftSeq, ForwardBatch, KvCache, LogitsMode, Model, PagedStorage, SeqChunk,
};

use crate::load::DraftModel;
use crate::{EngineError, LoadedModel, Result, Runtime};

const PAGE: usize = 16;

/// One speculative round's costs at one request.
#[derive(Clone, Debug)]
pub struct DraftBench {
    pub draft_tokens: usize,
    /// Context depth of the request.
    pub depth: usize,
    /// The drafter's `draft_tokens` steps.
    pub draft_seconds: f64,
    /// The target's step over the newest token and the drafts.
    pub verify_seconds: f64,
    /// A plain one-token decode step at the same depth (what a round replaces).
    pub decode_seconds: f64,
}

impl DraftBench {
    pub fn round_seconds(&self) -> f64 {
        self.draft_seconds + self.verify_seconds
    }

    /// Tokens a second if each round keeps `kept` drafts (a round yields `kept + 1`).
    pub fn tokens_per_second(&self, kept: usize) -> f64 {
        (kept + 1) as f64 / self.round_seconds()
    }

    /// Kept drafts a round needs to beat plain decoding.
    pub fn break_even(&self) -> f64 {
        self.round_seconds() / self.decode_seconds - 1.0
    }
}

impl LoadedModel {
    /// Speculative rounds of each of `draft_tokens` at `depth`, mean of `repeats` after
    /// two unmeasured ones. Needs a draft model ([`LoadedModel::load_draft`]).
    pub fn bench_speculative(
        &self,
        depth: usize,
        draft_tokens: &[usize],
        repeats: usize,
        kv: KvCacheDtype,
    ) -> Result<Vec<DraftBench>> {
        let draft = self
            .draft
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no draft model is loaded".into()))?;
        if depth == 0 || draft_tokens.contains(&0) {
            return Err(EngineError::Invalid(
                "depth and draft tokens must be positive".into(),
            ));
        }
        let layout = KvLayout::for_config(self.config(), kv)?;
        let most = draft_tokens.iter().max().copied().unwrap_or(1);
        let pages = (depth + most + 2).div_ceil(PAGE) + 1;
        let plan = PagePlan {
            full: pages,
            window: pages,
            page_size: PAGE,
        };
        let r = repeats.max(1);
        match (&self.runtime, draft) {
            (Runtime::Cpu(m), DraftModel::Cpu(d)) => {
                let pool = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new())?;
                rounds_on(m, d.as_ref(), pool, depth, draft_tokens, r)
            }
            (Runtime::Cuda(m), DraftModel::Cuda(d)) => {
                let storage = PagedStorage::new(m.backend().clone());
                let pool = KvPool::new(layout, plan, CacheType::Naive, storage)?;
                rounds_on(m, d.as_ref(), pool, depth, draft_tokens, r)
            }
            _ => Err(EngineError::Invalid(
                "the draft model sits on another device than the model".into(),
            )),
        }
    }
}

fn rounds_on<B: Backend, S: KvStorage>(
    model: &Model<B>,
    drafter: &Assistant<B>,
    mut kv: KvPool<S>,
    depth: usize,
    draft_tokens: &[usize],
    repeats: usize,
) -> Result<Vec<DraftBench>>
where
    KvPool<S>: KvCache<B>,
{
    let b = model.backend();
    let h = model.config().hidden_size;
    let req = kv.alloc_request();
    // The context is reserved, not computed: its K/V rows are whatever the slabs hold,
    // and every step still reads all of them.
    kv.extend(req, depth)?;
    let hidden = b.upload(HostSlice::F32(&vec![0.01; h]))?;
    let token = 7;
    let seq = DraftSeq {
        request: req,
        position: depth,
    };
    let mut time = |f: &mut dyn FnMut(&mut KvPool<S>) -> Result<()>| -> Result<f64> {
        for _ in 0..2 {
            f(&mut kv)?;
        }
        let t0 = Instant::now();
        for _ in 0..repeats {
            f(&mut kv)?;
        }
        Ok(t0.elapsed().as_secs_f64() / repeats as f64)
    };
    // A step over `tokens` at `depth`, its K/V dropped again.
    let step = |kv: &mut KvPool<S>, tokens: Vec<u32>, logits| -> Result<()> {
        kv.extend(req, tokens.len())?;
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                request: req,
                tokens,
                start: depth,
                logits,
            }],
        };
        match logits {
            LogitsMode::All => drop(model.forward_greedy_rows(kv, &batch)?),
            _ => drop(model.forward(kv, &batch)?),
        }
        kv.truncate(req, depth)?;
        Ok(())
    };
    let decode_seconds = time(&mut |kv| step(kv, vec![token], LogitsMode::Argmax))?;
    let mut out = Vec::with_capacity(draft_tokens.len());
    for &k in draft_tokens {
        let draft_seconds = time(&mut |kv| {
            drafter.draft(model, kv, &[seq], &[token], &hidden, k)?;
            Ok(())
        })?;
        let verify_seconds = time(&mut |kv| step(kv, vec![token; k + 1], LogitsMode::All))?;
        out.push(DraftBench {
            draft_tokens: k,
            depth,
            draft_seconds,
            verify_seconds,
            decode_seconds,
        });
    }
    kv.release(req)?;
    Ok(out)
}
