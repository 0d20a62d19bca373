//! Engine benchmarks on the loaded model: batched decode at a context depth, prefill of one
//! long prompt, and how many KV pages fit. Token values do not change the work, so prompts
//! are pseudo-random ids and the context of a decode benchmark is reserved in the pool
//! without being computed (its K/V rows are whatever the slabs hold): the decode step still
//! reads every one of those rows.

use std::time::Instant;

use strata_kernels::sampling::{draw_uniform, SamplerRng, SamplingParams};
use strata_kernels::Backend;
use strata_kv::{KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan, RequestId};
use strata_model::{ForwardBatch, KvCache, Launched, LogitsMode, Model, SeqChunk, FED_TOKEN};

use crate::placed::{OnOwnPool, OwnPool};
use crate::{EngineError, LoadedModel, OnDevice, Placement, Result};

const PAGE: usize = 16;

/// One decode measurement.
#[derive(Clone, Debug)]
pub struct DecodeBench {
    /// Sequences decoded together.
    pub batch: usize,
    /// Context tokens of each sequence.
    pub depth: usize,
    /// Timed steps.
    pub steps: usize,
    /// Mean wall-clock seconds of a timed step.
    pub seconds_per_step: f64,
    /// Generated tokens a second, all sequences together.
    pub tokens_per_second: f64,
}

/// One prefill measurement.
#[derive(Clone, Debug)]
pub struct PrefillBench {
    /// Prompt length.
    pub tokens: usize,
    /// Seconds of the best run.
    pub seconds: f64,
    /// Prompt tokens a second in the best run.
    pub tokens_per_second: f64,
    /// How long the host took to queue the step (the best run's): near `seconds`, the step
    /// waits on the host's launches rather than on the device.
    pub enqueue_seconds: f64,
}

fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SamplerRng::new(seed);
    (0..n)
        .map(|_| 3 + (rng.next_u64() % (vocab as u64 - 3)) as u32)
        .collect()
}

fn plan(tokens: usize) -> PagePlan {
    let pages = tokens.div_ceil(PAGE) + 1;
    PagePlan {
        full: pages,
        window: pages,
        page_size: PAGE,
    }
}

impl LoadedModel {
    /// Loads the LoRA adapters in `dirs` as ids 1, 2, ... for [`DecodeShape::adapters`],
    /// all of them on the backend at once.
    pub fn load_bench_adapters(&self, dirs: &[std::path::PathBuf], max_rank: usize) -> Result<()> {
        let host = self.runtime.dispatch(crate::engine::adapters::HostOf);
        host.set_max_resident(dirs.len().max(1));
        for (i, d) in dirs.iter().enumerate() {
            host.load(i as u32 + 1, d, max_rank)?;
        }
        Ok(())
    }

    /// Decode steps of `shape.batch` sequences each `shape.depth` tokens deep (after
    /// `shape.warmup` steps).
    pub fn bench_decode(&self, shape: DecodeShape, kv: KvCacheDtype) -> Result<DecodeBench> {
        let DecodeShape {
            batch,
            depth,
            steps,
            warmup,
            mixed_prompts,
            ..
        } = shape;
        let layout = KvLayout::for_config(self.config(), kv)?;
        // Each step's prompts are released once it is read; with overlap two steps' are
        // held at once.
        let prompts = 2 * mixed_prompts * (shape.longest_prompt() + PAGE);
        let p = plan(batch * (depth + steps + warmup + PAGE) + prompts);
        let secs = self.runtime.on_workers(|| {
            self.runtime.dispatch(OwnPool {
                layout,
                plan: p,
                job: DecodeOn { shape },
            })
        })?;
        Ok(DecodeBench {
            batch,
            depth,
            steps,
            seconds_per_step: secs / steps as f64,
            tokens_per_second: (batch * steps) as f64 / secs,
        })
    }

    /// One prompt of `tokens` pseudo-random ids in a single pass, best of `repeats`.
    pub fn bench_prefill(
        &self,
        tokens: usize,
        repeats: usize,
        kv: KvCacheDtype,
    ) -> Result<PrefillBench> {
        let layout = KvLayout::for_config(self.config(), kv)?;
        let p = plan(tokens);
        let prompt = ids(tokens, self.config().vocab_size, 1);
        let mut best = (f64::INFINITY, 0.0);
        for _ in 0..repeats.max(1) {
            let run = self.runtime.on_workers(|| {
                self.runtime.dispatch(OwnPool {
                    layout: layout.clone(),
                    plan: p,
                    job: PrefillOn { prompt: &prompt },
                })
            })?;
            if run.0 < best.0 {
                best = run;
            }
        }
        Ok(PrefillBench {
            tokens,
            seconds: best.0,
            tokens_per_second: tokens as f64 / best.0,
            enqueue_seconds: best.1,
        })
    }
}

/// Decode steps on the model's backend (see [`LoadedModel::bench_decode`]).
struct DecodeOn {
    shape: DecodeShape,
}

impl OnOwnPool for DecodeOn {
    type Output = f64;

    fn run<B: Placement>(self, placed: &OnDevice<B>, kv: KvPool<B::Storage>) -> Result<f64>
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        decode_on(&placed.model, kv, self.shape)
    }
}

/// One prompt's pass on the model's backend (see [`LoadedModel::bench_prefill`]).
struct PrefillOn<'a> {
    prompt: &'a [u32],
}

impl OnOwnPool for PrefillOn<'_> {
    type Output = (f64, f64);

    fn run<B: Placement>(self, placed: &OnDevice<B>, kv: KvPool<B::Storage>) -> Result<(f64, f64)>
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        prefill_on(&placed.model, kv, self.prompt)
    }
}

/// The decode loop's wall time over the timed steps (the pool's slot allocation and
/// commits included, as in serving). With `overlap`, each step is queued before the one
/// ahead of it is read, its ids fed from that step's greedy tokens on the backend (the
/// scheduler's `overlap`); the timed steps start with nothing queued either way.
fn decode_on<B: Backend, S: KvStorage>(
    model: &Model<B>,
    mut kv: KvPool<S>,
    shape: DecodeShape,
) -> Result<f64>
where
    KvPool<S>: KvCache<B>,
{
    let DecodeShape {
        batch,
        depth,
        steps,
        warmup,
        overlap,
        sampling,
        logprobs,
        mixed_prompts,
        mixed_len,
        mixed_len_step,
        adapters,
    } = shape;
    if batch == 0 || steps == 0 {
        return Err(EngineError::Invalid(
            "batch and steps must be positive".into(),
        ));
    }
    let vocab = model.config().vocab_size;
    let reqs: Vec<_> = (0..batch).map(|_| kv.alloc_request()).collect();
    for &r in &reqs {
        kv.extend(r, depth)?;
        kv.commit(r, depth)?;
    }
    let mut next = ids(batch, vocab, 2);
    // Next tokens chosen where the logits are (greedy, or drawn with `sampling`, with
    // their logprobs when asked for), as the server does.
    let params = sampling.unwrap_or_default();
    let mode = |step: usize, i: usize| {
        if params.is_greedy() && logprobs.is_none() {
            LogitsMode::Argmax
        } else {
            LogitsMode::Draw {
                params,
                uniform: draw_uniform(params.seed_or(0).wrapping_add(i as u64), step as u64),
                logprobs,
            }
        }
    };
    // A launched step and the prompts it carried, released once it is read.
    type Queued<B> = (Launched<B>, Vec<RequestId>);
    let read = |(step, prompts): Queued<B>, next: &mut [u32], kv: &mut KvPool<S>| -> Result<()> {
        let out = model.finish(step)?;
        for (i, n) in next.iter_mut().enumerate() {
            if let Some(t) = out.token(i) {
                *n = t;
            }
        }
        for r in prompts {
            kv.release(r)?;
        }
        Ok(())
    };
    let prompt = ids(shape.longest_prompt(), vocab, 3);
    let mut queued: Option<Queued<B>> = None;
    let mut start = Instant::now();
    for step in 0..warmup + steps {
        if step == warmup {
            if let Some(q) = queued.take() {
                read(q, &mut next, &mut kv)?;
            }
            start = Instant::now();
        }
        let pos = depth + step;
        let mut seqs = Vec::with_capacity(batch);
        for (i, &r) in reqs.iter().enumerate() {
            kv.extend(r, 1)?;
            seqs.push(SeqChunk {
                request: r,
                tokens: vec![if queued.is_some() {
                    FED_TOKEN | i as u32
                } else {
                    next[i]
                }],
                start: pos,
                logits: mode(step, i),
            });
        }
        // Whole prompts beside the decode rows, each wanting its first token, as a
        // server's step that admits requests while others decode.
        let len = mixed_len + step * mixed_len_step;
        let mut prompts = Vec::with_capacity(mixed_prompts);
        for p in 0..mixed_prompts {
            let r = kv.alloc_request();
            kv.extend(r, len)?;
            prompts.push(r);
            seqs.push(SeqChunk {
                request: r,
                tokens: prompt[..len].to_vec(),
                start: 0,
                logits: mode(step, batch + p),
            });
        }
        let launched = model.launch(
            &mut kv,
            &ForwardBatch {
                embeds: Vec::new(),
                seqs,
                adjust: Vec::new(),
                masked: Vec::new(),
                // Decode rows take adapters 1..=adapters in turn; prompts none.
                adapters: match adapters {
                    0 => Vec::new(),
                    n => (0..batch as u32).map(|i| 1 + i % n).collect(),
                },
            },
            queued.as_ref().map(|q| &q.0),
        )?;
        if let Some(q) = queued.take() {
            read(q, &mut next, &mut kv)?;
        }
        if overlap {
            queued = Some((launched, prompts));
        } else {
            read((launched, prompts), &mut next, &mut kv)?;
        }
        for &r in &reqs {
            kv.commit(r, pos + 1)?;
        }
    }
    if let Some(q) = queued {
        read(q, &mut next, &mut kv)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// What a decode benchmark runs: `batch` sequences `depth` tokens deep, `warmup` steps,
/// then `steps` timed ones, overlapped or not, every sequence greedy or drawn with
/// `sampling`, each token with its logprob and `logprobs` top ones when set.
#[derive(Clone, Copy, Debug)]
pub struct DecodeShape {
    /// Sequences decoded together.
    pub batch: usize,
    /// Context tokens of each sequence (reserved, not computed).
    pub depth: usize,
    /// Timed steps.
    pub steps: usize,
    /// Untimed steps run first.
    pub warmup: usize,
    /// Queue each step before reading the one ahead of it, as the scheduler's overlap does.
    pub overlap: bool,
    /// Draw every token with these settings; `None` for greedy.
    pub sampling: Option<SamplingParams>,
    /// Compute each token's logprob and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Prompts of `mixed_len` tokens added to every step whole (0: decode rows only).
    pub mixed_prompts: usize,
    /// Tokens of each added prompt on the first step.
    pub mixed_len: usize,
    /// Step n's prompts are `mixed_len + n * mixed_len_step` tokens long: with a step
    /// above 0 every step runs a row count not met before (cold shapes, as a server
    /// meets them).
    pub mixed_len_step: usize,
    /// Decode row `i` runs with LoRA adapter `1 + i % adapters` (0: none); the adapters
    /// are loaded first ([`LoadedModel::load_bench_adapters`]).
    pub adapters: u32,
}

impl DecodeShape {
    /// At least the longest prompt a step carries (`mixed_len` grown by `mixed_len_step`
    /// a step, over the warm-up and timed steps).
    fn longest_prompt(&self) -> usize {
        self.mixed_len + (self.warmup + self.steps) * self.mixed_len_step
    }
}

/// The step's wall time and the part of it the host spent queueing it. The prompt's token
/// is taken where the logits are (as a server's greedy request), so the launch returns
/// before the device finishes.
fn prefill_on<B: Backend, S: KvStorage>(
    model: &Model<B>,
    mut kv: KvPool<S>,
    prompt: &[u32],
) -> Result<(f64, f64)>
where
    KvPool<S>: KvCache<B>,
{
    let r = kv.alloc_request();
    kv.extend(r, prompt.len())?;
    let batch = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![SeqChunk {
            request: r,
            tokens: prompt.to_vec(),
            start: 0,
            logits: LogitsMode::Argmax,
        }],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    let t = Instant::now();
    let step = model.launch(&mut kv, &batch, None)?;
    let queued = t.elapsed().as_secs_f64();
    model.finish(step)?;
    Ok((t.elapsed().as_secs_f64(), queued))
}
