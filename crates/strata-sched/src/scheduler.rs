//! The scheduler's state and its public surface: submit, cancel, status.

use std::collections::VecDeque;

use strata_kv::{CacheType, HostStorage, KvPool, KvStatus, KvStorage};

use crate::overlap::InFlight;
use crate::seq::Seq;
use crate::{
    DraftStats, Event, EventKind, FinishReason, Request, SchedError, SchedulerConfig, SeqId,
    StepModel,
};

/// Continuous batching over one model and one KV pool.
///
/// Requests wait in a FIFO queue, are admitted while pages and `max_running_requests`
/// allow, and run together: each [`step`](Self::step) builds one forward pass holding one
/// decode token per running request plus prefill chunks, within `max_batch_tokens`. Older
/// requests come first; when pages run out the youngest running request is preempted
/// (its pages released, its tokens recomputed later) rather than anything failing.
pub struct Scheduler<M: StepModel<S>, S: KvStorage = HostStorage> {
    pub(crate) model: M,
    pub(crate) pool: KvPool<S>,
    pub(crate) config: SchedulerConfig,
    pub(crate) waiting: VecDeque<Seq>,
    /// Sorted by id: oldest first, the youngest (the first to preempt) last.
    pub(crate) running: Vec<Seq>,
    /// Events produced between steps (cancellations), handed out by the next step.
    pub(crate) pending: Vec<Event>,
    /// A decode step queued on the model and not yet read (`SchedulerConfig::overlap`).
    pub(crate) in_flight: Option<InFlight<M::Launched>>,
    next_id: u64,
    pub(crate) preemptions: u64,
    /// Steps queued behind the one before them, their ids fed from its greedy tokens.
    pub(crate) overlapped_steps: u64,
    /// Grammar masks computed (`draw_row`) and their host time.
    pub(crate) mask_stats: MaskStats,
    /// What the latest [`step`](Self::step) call queued, if anything.
    pub(crate) last_launch: Option<LaunchShape>,
    /// Distinct LoRA adapters one step may name (what fits on the backend at once).
    pub(crate) max_step_adapters: usize,
    /// Speculative rounds and their drafts, since the start.
    pub(crate) draft_stats: DraftStats,
}

/// The shape of a queued step, for step traces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchShape {
    /// Requests computing one token (decode rows, and prompts down to their last token).
    pub single_rows: usize,
    /// Tokens of the chunks longer than one (prefill).
    pub chunk_tokens: usize,
    /// Queued behind the step before it, its ids fed from that step's tokens.
    pub overlapped: bool,
    /// Seconds the model's `launch` took on the host (queueing the step's work; the whole
    /// step where the backend runs it synchronously, as the CPU does).
    pub launch_seconds: f64,
    /// Drafted tokens checked (a speculative round; 0 for other steps).
    pub drafts: usize,
}

/// Figures for `/metrics` and `/v1/cache/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedStatus {
    /// Requests admitted and generating (or computing their prompt).
    pub running: usize,
    /// Requests queued for admission.
    pub waiting: usize,
    /// Preemptions since the start.
    pub preemptions: u64,
    /// Decode steps queued before the step ahead of them was read (`overlap`), since the
    /// start.
    pub overlapped_steps: u64,
    /// Speculative rounds and drafts since the start.
    pub drafts: DraftStats,
    /// Grammar masks computed on the host since the start.
    pub masks: MaskStats,
    /// The KV pool's pages and prefix cache.
    pub kv: KvStatus,
}

/// The host's grammar masks (constrained requests' draws) since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MaskStats {
    /// Masks computed.
    pub masks: u64,
    /// Host seconds spent computing and applying them.
    pub seconds: f64,
}

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Takes the model and an empty pool.
    pub fn new(model: M, pool: KvPool<S>, config: SchedulerConfig) -> Result<Self, SchedError> {
        config.validate()?;
        if config.prompt_lookup.is_some() && (!model.verifies() || model.draft_tokens() > 0) {
            return Err(SchedError::Config(
                "prompt lookup needs a model that checks drafts and has no drafter of its own"
                    .into(),
            ));
        }
        if pool.running_requests() != 0 {
            return Err(SchedError::Config(format!(
                "the KV pool already holds {} request(s)",
                pool.running_requests()
            )));
        }
        Ok(Self {
            model,
            pool,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            pending: Vec::new(),
            in_flight: None,
            next_id: 0,
            preemptions: 0,
            last_launch: None,
            overlapped_steps: 0,
            mask_stats: MaskStats::default(),
            draft_stats: DraftStats::default(),
            max_step_adapters: usize::MAX,
        })
    }

    /// At most `n` distinct LoRA adapters in one step (at least 1): the model keeps that
    /// many on its backend at once. Requests on other adapters wait for a step with room,
    /// the oldest first.
    pub fn set_max_step_adapters(&mut self, n: usize) {
        self.max_step_adapters = n.max(1);
    }

    /// Whether every running request's adapter fits one step (a queued step takes them all).
    pub(crate) fn adapters_fit_one_step(&self) -> bool {
        let mut taken: Vec<u32> = Vec::new();
        for s in &self.running {
            let a = s.req.adapter;
            if a != 0 && !taken.contains(&a) {
                taken.push(a);
            }
        }
        taken.len() <= self.max_step_adapters
    }

    /// Whether a step whose adapters so far are `taken` has room for `adapter` (0, none,
    /// always has).
    pub(crate) fn adapter_fits(&self, taken: &[u32], adapter: u32) -> bool {
        adapter == 0 || taken.contains(&adapter) || taken.len() < self.max_step_adapters
    }

    /// Queues `req`. Every request ends with exactly one `Finished` event, invalid ones
    /// (empty prompt, unknown token ids, bad sampling settings, too long for the context
    /// or the pool) with `FinishReason::Error` at admission.
    pub fn submit(&mut self, req: Request) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        // Requests without a seed still get one of their own, fixed by their id.
        let fallback = self
            .config
            .seed
            .wrapping_add(id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let seed = req.sampling.seed_or(fallback);
        self.waiting.push_back(Seq::new(id, req, seed));
        id
    }

    /// Queues `req`, another sample of the prompt of `leader` (a request submitted
    /// before it, with the same prompt): it is first admitted only after `leader`'s prompt
    /// is computed and handed to the prefix cache, so that it reuses the prompt's whole
    /// pages (shared, pinned, never copied) and computes only the prompt's last partial
    /// page and last token into pages of its own. If `leader` has ended or has not started
    /// its prompt by then, this one runs as any other request. Without the radix cache
    /// (`naive`) nothing is shared.
    pub fn submit_sibling(&mut self, req: Request, leader: SeqId) -> SeqId {
        let id = self.submit(req);
        if let Some(seq) = self.waiting.back_mut() {
            seq.follows = Some(leader);
        }
        id
    }

    /// Whether `seq` waits for the request it follows to finish its prompt: only before its
    /// first admission, and only while that request runs without having finished its prompt
    /// (a request that is queued, preempted or gone does not hold it back, so nothing can
    /// wait on itself in a cycle).
    pub(crate) fn held_for_sibling(&self, seq: &Seq) -> bool {
        let Some(leader) = seq.follows.filter(|_| seq.cached_tokens.is_none()) else {
            return false;
        };
        self.running
            .binary_search_by_key(&leader, |s| s.id)
            .is_ok_and(|i| !self.running[i].prefilled)
    }

    /// Ends request `id` (the client went away): its pages are freed now and its
    /// `Finished { reason: Cancelled }` comes with the next step. Returns false if the
    /// request is unknown or already finished.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i)
        } else if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else {
            None
        };
        match seq {
            Some(seq) => {
                let event = self.finish(seq, FinishReason::Cancelled);
                self.pending.push(event);
                true
            }
            None => false,
        }
    }

    /// Whether request `id` still waits for its first step: queued and never admitted (or
    /// preempted before its first token).
    pub fn is_waiting_to_start(&self, id: SeqId) -> bool {
        self.waiting
            .iter()
            .any(|s| s.id == id && s.completion().is_empty())
    }

    /// Whether a step has anything to do (requests, events to hand out, or a queued step
    /// to read).
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty()
            || !self.running.is_empty()
            || !self.pending.is_empty()
            || self.in_flight.is_some()
    }

    /// Current figures: requests running and waiting, preemptions, overlapped steps, drafts
    /// and the KV pool.
    pub fn status(&self) -> SchedStatus {
        SchedStatus {
            running: self.running.len(),
            waiting: self.waiting.len(),
            preemptions: self.preemptions,
            overlapped_steps: self.overlapped_steps,
            drafts: self.draft_stats,
            masks: self.mask_stats,
            kv: self.pool.status(),
        }
    }

    /// What the latest [`step`](Self::step) call queued on the model (`None` if nothing).
    pub fn last_launch(&self) -> Option<LaunchShape> {
        self.last_launch
    }

    /// The settings it was built with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV pool.
    pub fn pool(&self) -> &KvPool<S> {
        &self.pool
    }

    /// The pool, for `flush_cache` or `rebuild` (which the pool refuses while requests
    /// hold pages). Do not add or release requests through it.
    pub fn pool_mut(&mut self) -> &mut KvPool<S> {
        &mut self.pool
    }

    /// The model it drives.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model and the pool, to change the model between steps (new weights), which
    /// also drops what the pool holds for the old one (its cache, its captured graphs).
    pub fn model_and_pool_mut(&mut self) -> (&mut M, &mut KvPool<S>) {
        (&mut self.model, &mut self.pool)
    }

    /// Whether the pool keeps finished prefixes for reuse.
    pub(crate) fn caching(&self) -> bool {
        self.pool.cache_type() == CacheType::Radix
    }

    /// Ends `seq`: frees its pages (its computed tokens go to the prefix cache first,
    /// unless it failed) and describes the end.
    pub(crate) fn finish(&mut self, mut seq: Seq, reason: FinishReason) -> Event {
        if let Some(kv) = seq.kv.take() {
            if self.caching() && !matches!(reason, FinishReason::Error(_)) {
                // Losing the cache entry is harmless; the release below still runs.
                let _ = self.pool.cache_prefix(kv, &seq.cache_key(seq.computed));
            }
            let released = self.pool.release(kv);
            debug_assert!(released.is_ok(), "release of a running request failed");
        }
        Event {
            id: seq.id,
            kind: EventKind::Finished {
                reason,
                prompt_tokens: seq.prompt_len,
                completion_tokens: seq.completion().len(),
                cached_tokens: seq.cached_tokens.unwrap_or(0),
            },
        }
    }
}
