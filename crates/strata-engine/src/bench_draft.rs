//! What a speculative round costs: the drafter's steps and the target's verification of
//! them, for one request or many at once, beside a plain decode step of the same requests
//! at the same depth. How many drafts a round keeps depends on the weights (random weights
//! keep almost none), so the benchmark reports the costs and the rate each number of kept
//! drafts would give.

use std::time::Instant;

use strata_kernels::{Backend, HostSlice};
use strata_kv::{KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{Assistant, DraftSeq, ForwardBatch, KvCache, LogitsMode, Model, SeqChunk};

use crate::placed::{OnOwnPool, OwnPool};
use crate::{EngineError, LoadedModel, OnDevice, Placement, Result};

const PAGE: usize = 16;

/// One speculative round's costs.
#[derive(Clone, Debug)]
pub struct DraftBench {
    /// Requests in the round, each drafting `draft_tokens`.
    pub requests: usize,
    /// Tokens each request drafts in the round.
    pub draft_tokens: usize,
    /// Context depth of the request.
    pub depth: usize,
    /// The drafter's `draft_tokens` steps.
    pub draft_seconds: f64,
    /// The target's step over the newest token and the drafts.
    pub verify_seconds: f64,
    /// A plain decode step of the same requests (a token each) at the same depth: what a
    /// round replaces.
    pub decode_seconds: f64,
}

impl DraftBench {
    /// Seconds of the whole round: drafting plus verification.
    pub fn round_seconds(&self) -> f64 {
        self.draft_seconds + self.verify_seconds
    }

    /// Tokens a second, all requests together, if each request keeps `kept` drafts a round
    /// (a round yields `kept + 1` a request).
    pub fn tokens_per_second(&self, kept: usize) -> f64 {
        (self.requests * (kept + 1)) as f64 / self.round_seconds()
    }

    /// Kept drafts a request needs a round to beat plain decoding.
    pub fn break_even(&self) -> f64 {
        self.round_seconds() / self.decode_seconds - 1.0
    }
}

impl LoadedModel {
    /// Speculative rounds of `requests` requests, each of `draft_tokens` at `depth`, mean
    /// of `repeats` after two unmeasured ones. Needs a draft model
    /// ([`LoadedModel::load_draft`]).
    pub fn bench_speculative(
        &self,
        requests: usize,
        depth: usize,
        draft_tokens: &[usize],
        repeats: usize,
        kv: KvCacheDtype,
    ) -> Result<Vec<DraftBench>> {
        if !self.runtime.has_draft() {
            return Err(EngineError::Invalid("no draft model is loaded".into()));
        }
        if requests == 0 || depth == 0 || draft_tokens.contains(&0) {
            return Err(EngineError::Invalid(
                "requests, depth and draft tokens must be positive".into(),
            ));
        }
        let layout = KvLayout::for_config(self.config(), kv)?;
        let most = draft_tokens.iter().max().copied().unwrap_or(1);
        let pages = requests * ((depth + most + 2).div_ceil(PAGE) + 1);
        let plan = PagePlan {
            full: pages,
            window: pages,
            page_size: PAGE,
        };
        self.runtime.dispatch(OwnPool {
            layout,
            plan,
            job: RoundsOn {
                shape: (requests, depth),
                draft_tokens,
                repeats: repeats.max(1),
            },
        })
    }
}

/// Speculative rounds on the model's backend, with its drafter (see
/// [`LoadedModel::bench_speculative`]).
struct RoundsOn<'a> {
    shape: (usize, usize),
    draft_tokens: &'a [usize],
    repeats: usize,
}

impl OnOwnPool for RoundsOn<'_> {
    type Output = Vec<DraftBench>;

    fn run<B: Placement>(
        self,
        placed: &OnDevice<B>,
        kv: KvPool<B::Storage>,
    ) -> Result<Vec<DraftBench>>
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        let d = placed
            .draft
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("no draft model is loaded".into()))?;
        let (model, shape, k, r) = (&placed.model, self.shape, self.draft_tokens, self.repeats);
        rounds_on(model, d, kv, shape, k, r)
    }
}

fn rounds_on<B: Backend, S: KvStorage>(
    model: &Model<B>,
    drafter: &Assistant<B>,
    mut kv: KvPool<S>,
    (requests, depth): (usize, usize),
    draft_tokens: &[usize],
    repeats: usize,
) -> Result<Vec<DraftBench>>
where
    KvPool<S>: KvCache<B>,
{
    let b = model.backend();
    let h = model.config().hidden_size;
    let reqs: Vec<_> = (0..requests).map(|_| kv.alloc_request()).collect();
    // The contexts are reserved, not computed: their K/V rows are whatever the slabs hold,
    // and every step still reads all of them.
    for &r in &reqs {
        kv.extend(r, depth)?;
    }
    let hidden = b.upload(HostSlice::F32(&vec![0.01; requests * h]))?;
    let token = 7;
    let seqs: Vec<DraftSeq> = reqs
        .iter()
        .map(|&request| DraftSeq {
            request,
            position: depth,
        })
        .collect();
    let tokens = vec![token; requests];
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
    // A step over `per_request` tokens of every request at `depth`, its K/V dropped again.
    let step = |kv: &mut KvPool<S>, per_request: usize, logits| -> Result<()> {
        let mut seqs = Vec::with_capacity(requests);
        for &request in &reqs {
            kv.extend(request, per_request)?;
            seqs.push(SeqChunk {
                request,
                tokens: vec![token; per_request],
                start: depth,
                logits,
            });
        }
        let batch = ForwardBatch {
            embeds: Vec::new(),
            seqs,
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        match logits {
            LogitsMode::All => drop(model.forward_greedy_rows(kv, &batch)?),
            _ => drop(model.forward(kv, &batch)?),
        }
        for &request in &reqs {
            kv.truncate(request, depth)?;
        }
        Ok(())
    };
    let decode_seconds = time(&mut |kv| step(kv, 1, LogitsMode::Argmax))?;
    let mut out = Vec::with_capacity(draft_tokens.len());
    for &k in draft_tokens {
        let draft_seconds = time(&mut |kv| {
            drafter.draft(model, kv, &seqs, &tokens, &hidden, k)?;
            Ok(())
        })?;
        let verify_seconds = time(&mut |kv| step(kv, k + 1, LogitsMode::All))?;
        out.push(DraftBench {
            requests,
            draft_tokens: k,
            depth,
            draft_seconds,
            verify_seconds,
            decode_seconds,
        });
    }
    for r in reqs {
        kv.release(r)?;
    }
    Ok(out)
}
