//! One request generated to completion on its own KV pool.

use std::time::Instant;

use strata_kernels::sampling::{draw_uniform, SamplingParams};
use strata_kernels::Backend;
use strata_kv::{
    CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan, RequestId,
};
use strata_model::{ForwardBatch, KvCache, LogitsMode, Model, PagedStorage, SeqChunk};

use crate::load::DraftModel;
use crate::speculative::{self, DraftStats, Drafter};
use crate::{EngineError, LoadedModel, Result, Runtime};

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub kv_cache_dtype: KvCacheDtype,
    /// Stop at the model's end-of-sequence tokens.
    pub stop_at_eos: bool,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
    /// With a draft model loaded: tokens drafted a round (0 turns speculation off).
    pub draft_tokens: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            sampling: SamplingParams::greedy(),
            kv_cache_dtype: KvCacheDtype::Auto,
            stop_at_eos: true,
            prefill_chunk: 512,
            draft_tokens: 3,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub prompt_ms: f64,
    pub predicted_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_per_second: f64,
}

impl Timings {
    /// `prompt` tokens in `prompt_ms`, then `predicted` tokens in `predicted_ms`.
    fn new(prompt: usize, prompt_ms: f64, predicted: usize, predicted_ms: f64) -> Self {
        let per_second = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        Self {
            prompt_ms,
            predicted_ms,
            prompt_per_second: per_second(prompt, prompt_ms),
            predicted_per_second: per_second(predicted, predicted_ms),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GenerateResult {
    pub tokens: Vec<u32>,
    /// Why generation ended: "stop" (an EOS token) or "length".
    pub finish_reason: &'static str,
    pub timings: Timings,
    /// How the drafts fared, when a draft model drafted.
    pub draft: Option<DraftStats>,
}

const PAGE_SIZE: usize = 16;

impl LoadedModel {
    /// Generates up to `max_tokens` after `prompt`.
    pub fn generate(&self, prompt: &[u32], p: &GenerateParams) -> Result<GenerateResult> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt has no tokens".into()));
        }
        let ctx = self.config().max_position_embeddings;
        if prompt.len() + p.max_tokens > ctx {
            return Err(EngineError::Invalid(format!(
                "prompt ({}) + max_tokens ({}) exceeds the model's context of {ctx}",
                prompt.len(),
                p.max_tokens
            )));
        }
        let layout = KvLayout::for_config(self.config(), p.kv_cache_dtype)?;
        let pages = (prompt.len() + p.max_tokens).div_ceil(PAGE_SIZE) + 1;
        let plan = PagePlan {
            full: pages,
            window: pages,
            page_size: PAGE_SIZE,
        };
        let draft = self.draft.as_ref().filter(|_| p.draft_tokens > 0);
        if draft.is_some() && !p.sampling.is_greedy() {
            return Err(EngineError::Invalid(
                "speculative decoding is greedy only: use temperature 0, or draft 0 tokens".into(),
            ));
        }
        let stop = &self.stop_ids;
        match (&self.runtime, draft) {
            (Runtime::Cpu(m), None) => {
                let kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new())?;
                run(m, kv, prompt, p, stop)
            }
            (Runtime::Cuda(m), None) => {
                let storage = PagedStorage::new(m.backend().clone());
                let kv = KvPool::new(layout, plan, CacheType::Naive, storage)?;
                run(m, kv, prompt, p, stop)
            }
            (Runtime::Cpu(m), Some(DraftModel::Cpu(d))) => {
                let kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new())?;
                run_speculative(m, d.as_ref(), kv, prompt, p, stop)
            }
            (Runtime::Cuda(m), Some(DraftModel::Cuda(d))) => {
                let storage = PagedStorage::new(m.backend().clone());
                let kv = KvPool::new(layout, plan, CacheType::Naive, storage)?;
                run_speculative(m, d.as_ref(), kv, prompt, p, stop)
            }
            _ => Err(EngineError::Invalid(
                "the draft model sits on another device than the model".into(),
            )),
        }
    }
}

/// [`speculative::generate`] on a request of its own pool, timed as [`run`] times.
fn run_speculative<B: Backend, S: KvStorage, D: Drafter<B>>(
    model: &Model<B>,
    drafter: &D,
    mut kv: KvPool<S>,
    prompt: &[u32],
    p: &GenerateParams,
    stop_ids: &[u32],
) -> Result<GenerateResult>
where
    KvPool<S>: KvCache<B>,
{
    let req = kv.alloc_request();
    let t0 = Instant::now();
    let out = speculative::generate(model, drafter, &mut kv, req, prompt, p, stop_ids)?;
    let end = Instant::now();
    kv.release(req)?;
    let prompt_ms = (out.prompt_done - t0).as_secs_f64() * 1e3;
    // Counted as `run` counts: every token over the time after the prompt's step.
    let predicted_ms = (end - out.prompt_done).as_secs_f64() * 1e3;
    let n = out.tokens.len();
    Ok(GenerateResult {
        finish_reason: if out.stopped { "stop" } else { "length" },
        timings: Timings::new(prompt.len(), prompt_ms, n, predicted_ms),
        tokens: out.tokens,
        draft: Some(out.stats),
    })
}

/// Runs `prompt` on `req` in `chunk`-token steps that ask no logits, all but the last,
/// and returns that last step's batch (its slots reserved) asking `last` logits.
pub(crate) fn prefill_to_last<B: Backend, S: KvStorage>(
    model: &Model<B>,
    kv: &mut KvPool<S>,
    req: RequestId,
    prompt: &[u32],
    chunk: usize,
    last: LogitsMode,
) -> Result<ForwardBatch>
where
    KvPool<S>: KvCache<B>,
{
    let chunk = chunk.max(1);
    let step = |start: usize, tokens: &[u32], logits| ForwardBatch {
        seqs: vec![SeqChunk {
            request: req,
            tokens: tokens.to_vec(),
            start,
            logits,
        }],
    };
    let from = prompt.len().saturating_sub(1) / chunk * chunk;
    for (i, part) in prompt[..from].chunks(chunk).enumerate() {
        kv.extend(req, part.len())?;
        model.forward(kv, &step(i * chunk, part, LogitsMode::None))?;
    }
    kv.extend(req, prompt.len() - from)?;
    Ok(step(from, &prompt[from..], last))
}

/// Prefill in chunks, then one token per step, on one request of its own pool.
fn run<B: Backend, S: KvStorage>(
    model: &Model<B>,
    mut kv: KvPool<S>,
    prompt: &[u32],
    p: &GenerateParams,
    stop_ids: &[u32],
) -> Result<GenerateResult>
where
    KvPool<S>: KvCache<B>,
{
    {
        let req = kv.alloc_request();
        let seed = p.sampling.seed_or(0x5EED);

        let t0 = Instant::now();
        let chunk = p.prefill_chunk.max(1);
        // The model returns the token (the argmax, or the draw of token `index`), computed
        // where the logits are.
        let want = |index: usize| {
            if p.sampling.is_greedy() {
                LogitsMode::Argmax
            } else {
                LogitsMode::Draw {
                    params: p.sampling,
                    uniform: draw_uniform(seed, index as u64),
                    logprobs: None,
                }
            }
        };
        // The token of the step that reached the end of the sequence (greedy or drawn).
        let last = prefill_to_last(model, &mut kv, req, prompt, chunk, want(prompt.len()))?;
        let mut step = model.forward(&mut kv, &last)?.token(0);
        let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

        let t1 = Instant::now();
        let mut tokens = Vec::with_capacity(p.max_tokens);
        let mut finish_reason = "length";
        while tokens.len() < p.max_tokens {
            let Some(next) = step else {
                return Err(EngineError::Invalid("the model returned no token".into()));
            };
            tokens.push(next);
            if p.stop_at_eos && stop_ids.contains(&next) {
                finish_reason = "stop";
                break;
            }
            if tokens.len() == p.max_tokens {
                break;
            }
            let pos = prompt.len() + tokens.len() - 1;
            kv.extend(req, 1)?;
            let batch = ForwardBatch {
                seqs: vec![SeqChunk {
                    request: req,
                    tokens: vec![next],
                    start: pos,
                    logits: want(pos + 1),
                }],
            };
            step = model.forward(&mut kv, &batch)?.token(0);
        }
        let predicted_ms = t1.elapsed().as_secs_f64() * 1e3;
        kv.release(req)?;
        Ok(GenerateResult {
            finish_reason,
            timings: Timings::new(prompt.len(), prompt_ms, tokens.len(), predicted_ms),
            tokens,
            draft: None,
        })
    }
}

impl LoadedModel {
    /// Teacher-forced logits of every position of `ids` (`ids.len() x vocab`), fed in
    /// passes of the given sizes (which must sum to `ids.len()`; a size of 1 is a decode
    /// step), on a pool of `kv_cache_dtype`. With `last_rows`, each pass asks only for its
    /// last position's logits, as generation does (`passes.len() x vocab`).
    pub fn score(
        &self,
        ids: &[u32],
        passes: &[usize],
        kv_cache_dtype: KvCacheDtype,
        last_rows: bool,
    ) -> Result<Vec<f32>> {
        if passes.iter().sum::<usize>() != ids.len() || passes.contains(&0) {
            return Err(EngineError::Invalid(format!(
                "passes {passes:?} do not split {} tokens",
                ids.len()
            )));
        }
        let layout = KvLayout::for_config(self.config(), kv_cache_dtype)?;
        let pages = ids.len().div_ceil(PAGE_SIZE) + 1;
        let plan = PagePlan {
            full: pages,
            window: pages,
            page_size: PAGE_SIZE,
        };
        match &self.runtime {
            Runtime::Cpu(m) => {
                let kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new())?;
                score_on(m, kv, ids, passes, last_rows)
            }
            Runtime::Cuda(m) => {
                let storage = PagedStorage::new(m.backend().clone());
                let kv = KvPool::new(layout, plan, CacheType::Naive, storage)?;
                score_on(m, kv, ids, passes, last_rows)
            }
        }
    }
}

fn score_on<B: Backend, S: KvStorage>(
    model: &Model<B>,
    mut kv: KvPool<S>,
    ids: &[u32],
    passes: &[usize],
    last_rows: bool,
) -> Result<Vec<f32>>
where
    KvPool<S>: KvCache<B>,
{
    let req = kv.alloc_request();
    let mut out = Vec::with_capacity(ids.len() * model.config().vocab_size);
    let mut start = 0;
    for &n in passes {
        kv.extend(req, n)?;
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                request: req,
                tokens: ids[start..start + n].to_vec(),
                start,
                logits: if last_rows {
                    LogitsMode::Last
                } else {
                    LogitsMode::All
                },
            }],
        };
        out.extend(model.forward(&mut kv, &batch)?.logits.remove(0));
        kv.commit(req, start + n)?;
        start += n;
    }
    kv.release(req)?;
    Ok(out)
}
