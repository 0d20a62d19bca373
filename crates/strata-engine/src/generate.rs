//! One request generated to completion on its own KV pool, through the same scheduler
//! (and so the same prefill, decode and speculative rounds) that `strata serve` runs.

use std::time::Instant;

use strata_kernels::sampling::SamplingParams;
use strata_kernels::Backend;
use strata_kv::{KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{Drafting, ForwardBatch, KvCache, LogitsMode, Model, ModelRunner, SeqChunk};
use strata_sched::{
    DraftStats, EventKind, FinishReason, PromptLookup, Request, Scheduler, SchedulerConfig,
    StepModel,
};

use crate::placed::{OnOwnPool, OwnPool};
use crate::{EngineError, LoadedModel, OnDevice, Placement, Result};

/// Settings of one [`LoadedModel::generate`] call.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Completion tokens at most.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: SamplingParams,
    /// Element type of the request's KV pool.
    pub kv_cache_dtype: KvCacheDtype,
    /// Stop at the model's end-of-sequence tokens.
    pub stop_at_eos: bool,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
    /// Tokens drafted a round, by the loaded draft model or by prompt lookup (0 turns
    /// speculation off).
    pub draft_tokens: usize,
    /// Draft by prompt lookup, matching the last `n` tokens (down to 2) of the request
    /// earlier in it; not with a draft model.
    pub prompt_lookup: Option<usize>,
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
            prompt_lookup: None,
        }
    }
}

/// Where a generation's time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Milliseconds from submitting the request to its first token.
    pub prompt_ms: f64,
    /// Milliseconds from the first token to the end.
    pub predicted_ms: f64,
    /// Prompt tokens a second over `prompt_ms`.
    pub prompt_per_second: f64,
    /// Generated tokens a second over `predicted_ms`.
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

/// What [`LoadedModel::generate`] produced.
#[derive(Clone, Debug)]
pub struct GenerateResult {
    /// The generated token ids (an EOS that ended generation included).
    pub tokens: Vec<u32>,
    /// Why generation ended: "stop" (an EOS token) or "length".
    pub finish_reason: &'static str,
    /// Where the time went.
    pub timings: Timings,
    /// How the drafts fared, when a draft model or prompt lookup drafted.
    pub draft: Option<DraftStats>,
}

const PAGE_SIZE: usize = 16;

/// Seeds a request that brings no seed of its own (the scheduler's seed for request 0).
const SEED: u64 = 0x5EED;

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
        let drafts = self.runtime.has_draft() && p.draft_tokens > 0;
        let lookup = p.prompt_lookup.filter(|_| p.draft_tokens > 0);
        if drafts && lookup.is_some() {
            return Err(EngineError::Invalid(
                "draft with the draft model or by prompt lookup, not both".into(),
            ));
        }
        let layout = KvLayout::for_config(self.config(), p.kv_cache_dtype)?;
        // Room for the sequence and for one round's drafts past its end.
        let pages = (prompt.len() + p.max_tokens + p.draft_tokens + 1).div_ceil(PAGE_SIZE) + 1;
        let plan = PagePlan {
            full: pages,
            window: pages,
            page_size: PAGE_SIZE,
        };
        let config = SchedulerConfig {
            max_running_requests: 1,
            max_batch_tokens: p.prefill_chunk.max(p.draft_tokens + 1),
            prefill_chunk: p.prefill_chunk.max(1),
            seed: SEED,
            overlap: true,
            draft_max_requests: 1,
            prompt_lookup: lookup.map(|n| PromptLookup::new(n, p.draft_tokens)),
        };
        let request = Request {
            sampling: SamplingParams {
                seed: Some(p.sampling.seed_or(SEED)),
                ..p.sampling
            },
            stop_ids: self.stop_ids.clone(),
            ignore_eos: !p.stop_at_eos,
            ..Request::new(prompt.to_vec(), p.max_tokens)
        };
        let draft_tokens = if drafts { p.draft_tokens } else { 0 };
        self.runtime.on_workers(|| {
            self.runtime.dispatch(OwnPool {
                layout,
                plan,
                job: GenerateOn {
                    config,
                    request,
                    draft_tokens,
                },
            })
        })
    }
}

/// One request on a pool of its own, on the model's backend (drafted by its drafter
/// when `draft_tokens` is positive).
struct GenerateOn {
    config: SchedulerConfig,
    request: Request,
    draft_tokens: usize,
}

impl OnOwnPool for GenerateOn {
    type Output = GenerateResult;

    fn run<B: Placement>(
        self,
        placed: &OnDevice<B>,
        kv: KvPool<B::Storage>,
    ) -> Result<GenerateResult>
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        let model = placed.model.clone();
        match placed.draft.clone().filter(|_| self.draft_tokens > 0) {
            Some(d) => {
                let model = Drafting::new(model, d, self.draft_tokens);
                run(model, kv, self.config, self.request)
            }
            None => run(ModelRunner(model), kv, self.config, self.request),
        }
    }
}

/// Runs `request` alone through a scheduler over `model` and `kv`. The prompt's time ends
/// with its first token; every later token counts towards the predicted time.
fn run<M: StepModel<S>, S: KvStorage>(
    model: M,
    kv: KvPool<S>,
    config: SchedulerConfig,
    request: Request,
) -> Result<GenerateResult> {
    let prompt_len = request.prompt.len();
    let mut sched =
        Scheduler::new(model, kv, config).map_err(|e| EngineError::Invalid(e.to_string()))?;
    let t0 = Instant::now();
    sched.submit(request);
    let mut tokens = Vec::new();
    let mut first_token = None;
    let mut finish = None;
    while finish.is_none() && sched.has_work() {
        for event in sched.step() {
            match event.kind {
                EventKind::Token { token, .. } => {
                    first_token.get_or_insert_with(Instant::now);
                    tokens.push(token);
                }
                EventKind::Finished { reason, .. } => finish = Some(reason),
                EventKind::PromptLogprobs { .. } => {}
            }
        }
    }
    let end = Instant::now();
    let finish_reason = match finish {
        Some(FinishReason::Stop) => "stop",
        Some(FinishReason::Length) => "length",
        Some(FinishReason::Error(e)) => return Err(EngineError::Invalid(e)),
        Some(FinishReason::Cancelled) | None => {
            return Err(EngineError::Internal(
                "the request ended without finishing".into(),
            ))
        }
    };
    let prompt_done = first_token.unwrap_or(end);
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    let drafts = sched.status().drafts;
    let drafted = config.prompt_lookup.is_some() || sched.model().draft_tokens() > 0;
    Ok(GenerateResult {
        finish_reason,
        timings: Timings::new(
            prompt_len,
            ms(t0, prompt_done),
            tokens.len(),
            ms(prompt_done, end),
        ),
        tokens,
        draft: drafted.then_some(drafts),
    })
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
        self.runtime.on_workers(|| {
            self.runtime.dispatch(OwnPool {
                layout,
                plan,
                job: ScoreOn {
                    ids,
                    passes,
                    last_rows,
                },
            })
        })
    }
}

/// Teacher-forced logits on the model's backend (see [`LoadedModel::score`]).
struct ScoreOn<'a> {
    ids: &'a [u32],
    passes: &'a [usize],
    last_rows: bool,
}

impl OnOwnPool for ScoreOn<'_> {
    type Output = Vec<f32>;

    fn run<B: Placement>(self, placed: &OnDevice<B>, kv: KvPool<B::Storage>) -> Result<Vec<f32>>
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        score_on(&placed.model, kv, self.ids, self.passes, self.last_rows)
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
            embeds: Vec::new(),
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
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        out.extend(model.forward(&mut kv, &batch)?.logits.remove(0));
        kv.commit(req, start + n)?;
        start += n;
    }
    kv.release(req)?;
    Ok(out)
}
