//! The engine thread: owns the scheduler, turns commands into scheduler calls and scheduler
//! events into client updates.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use strata_kv::{KvLayout, KvPool, KvStorage, PagePlan};
use strata_sched::{EventKind, FinishReason, Request, Scheduler, SeqId, StepModel};
use strata_tokenizer::Tokenizer;
use tokio::sync::mpsc as tmpsc;

use super::adapters::SharedTable;
use super::control::{ModelControl, NewWeights};
use super::text::{stop_string_test, TextStream};
use super::trace::{StepTrace, TracedStep};
use super::{
    Adapter, Command, EngineOptions, EngineStatus, GenerationRequest, Metrics, RequestTimings,
    Update, Usage, WeightsVersion,
};
use crate::{EngineError, LoadedModel, Result};

/// What the engine remembers about one live request.
struct Live {
    client: u64,
    updates: tmpsc::UnboundedSender<Update>,
    text: Option<TextStream>,
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Why the engine itself cancelled the request ("timeout" or "queue_timeout"); its
    /// `Cancelled` end is reported under this reason.
    ended_by: Option<&'static str>,
    /// The adapter it runs with, held until it ends (an unload waits for it).
    _adapter: Option<Arc<Adapter>>,
}

/// The engine thread's end of the adapters and weights: the table of adapters, the served
/// model's name, and which weights are served.
pub(crate) struct ServedEnd {
    pub table: SharedTable,
    pub model_name: String,
    pub weights: Arc<Mutex<WeightsVersion>>,
}

pub(crate) struct Worker<M: StepModel<S>, S: KvStorage> {
    sched: Scheduler<M, S>,
    tokenizer: Option<Arc<Tokenizer>>,
    stop_ids: Vec<u32>,
    opts: EngineOptions,
    status: Arc<Mutex<EngineStatus>>,
    metrics: Arc<Metrics>,
    live: HashMap<SeqId, Live>,
    by_client: HashMap<u64, SeqId>,
    /// Submissions held back while a rebuild waits for the pool to drain.
    held: Vec<Command>,
    rebuild: Option<Command>,
    /// The adapters' table and the weights' version (set once the worker is built).
    pub(crate) served: Option<ServedEnd>,
    /// Acts on the served model: adapters, weight updates (set once the worker is built).
    pub(crate) control: Option<Box<dyn ModelControl<M, S>>>,
    /// A weight update is loading.
    updating: bool,
    /// Loaded weights waiting for the running requests to end, to be swapped in.
    swap: Option<PendingSwap>,
}

/// New weights loaded from a directory, and who waits for them to be served.
type PendingSwap = (
    std::path::PathBuf,
    NewWeights,
    tokio::sync::oneshot::Sender<Result<WeightsVersion>>,
);

/// The pool `opts` asks for, over `storage`.
fn pool_for<S: KvStorage>(
    loaded: &LoadedModel,
    opts: &EngineOptions,
    storage: S,
) -> Result<KvPool<S>> {
    let layout = KvLayout::for_config(loaded.config(), opts.kv_cache_dtype)?;
    Ok(KvPool::with_budget(
        layout,
        opts.kv_budget_bytes,
        opts.page_size,
        opts.window_ratio,
        opts.cache_type,
        storage,
    )?)
}

impl<M: StepModel<S>, S: KvStorage> Worker<M, S> {
    /// A worker for `model` with the KV pool `opts` asks for, over `storage`.
    pub(crate) fn new(
        loaded: &LoadedModel,
        model: M,
        storage: S,
        opts: EngineOptions,
        status: Arc<Mutex<EngineStatus>>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let pool = pool_for(loaded, &opts, storage)?;
        let mut sched = Scheduler::new(model, pool, opts.scheduler)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        sched.set_max_step_adapters(opts.max_loras);
        let worker = Self {
            sched,
            tokenizer: loaded.tokenizer.clone(),
            stop_ids: loaded.stop_ids.clone(),
            opts,
            status,
            metrics,
            live: HashMap::new(),
            by_client: HashMap::new(),
            held: Vec::new(),
            rebuild: None,
            served: None,
            control: None,
            updating: false,
            swap: None,
        };
        worker.publish_status();
        Ok(worker)
    }

    pub(crate) fn run(mut self, rx: mpsc::Receiver<Command>) {
        // When the last step ended, while requests keep running (a wait for work is no gap).
        let mut last_step: Option<Instant> = None;
        let mut trace = self.opts.step_trace.as_deref().and_then(|p| {
            StepTrace::create(p)
                .map_err(|e| eprintln!("[strata] step trace {}: {e}", p.display()))
                .ok()
        });
        loop {
            // A rebuild waits for the pool to drain; the step that drained it was the last
            // one, so the rebuild is carried out here rather than after the next command.
            self.try_rebuild();
            self.try_swap();
            let idle = !self.sched.has_work();
            if idle {
                last_step = None;
                if trace.as_mut().is_some_and(|t| !t.flush()) {
                    trace = None;
                }
            }
            let first = if idle {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                None
            };
            for cmd in first.into_iter().chain(rx.try_iter()) {
                if !self.command(cmd) {
                    return;
                }
            }
            self.try_rebuild();
            self.try_swap();
            self.expire(Instant::now());
            if self.sched.has_work() {
                let start = Instant::now();
                if let Some(end) = last_step {
                    self.metrics.step_gap.observe((start - end).as_secs_f64());
                }
                let events = self.sched.step();
                let end = Instant::now();
                self.metrics.step.observe((end - start).as_secs_f64());
                if let Some(t) = trace.as_mut() {
                    let s = self.sched.status();
                    let step = TracedStep {
                        start,
                        end,
                        launch: self.sched.last_launch(),
                        running: s.running,
                        waiting: s.waiting,
                    };
                    if !t.record(&step) {
                        trace = None;
                    }
                }
                last_step = Some(end);
                for e in events {
                    self.event(e.id, e.kind);
                }
                self.publish_status();
            }
        }
    }

    /// Returns false on shutdown.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            // New requests wait while a rebuild or a weight swap waits for the running ones
            // to end, so each request runs on one pool and one set of weights throughout.
            Command::Submit { .. } if self.rebuild.is_some() || self.swap.is_some() => {
                self.held.push(cmd)
            }
            Command::Submit {
                client,
                req,
                updates,
                follows,
            } => self.submit(client, *req, updates, follows),
            Command::Cancel(client) => {
                if let Some(id) = self.by_client.get(&client) {
                    self.sched.cancel(*id);
                }
            }
            // One rebuild at a time: a later one waits with the held requests and runs
            // after it, so every rebuild is answered.
            Command::Rebuild { .. } if self.rebuild.is_some() => self.held.push(cmd),
            Command::Rebuild { .. } => self.rebuild = Some(cmd),
            Command::Flush(reply) => {
                let freed = self.sched.pool_mut().flush_cache();
                // Publish before replying, so a client that reads the status next sees it.
                self.publish_status();
                let _ = reply.send(freed);
            }
            Command::LoadAdapter { name, dir, reply } => {
                let done = match (&self.served, &self.control) {
                    (Some(a), Some(c)) => a.table.lock().expect("adapter table lock").load(
                        c.host(self.sched.model()),
                        &name,
                        &dir,
                        &a.model_name,
                    ),
                    _ => Err(EngineError::Invalid("this engine takes no adapters".into())),
                };
                let _ = reply.send(done);
            }
            Command::UnloadAdapter { name, reply } => {
                let done = match (&self.served, &self.control) {
                    (Some(a), Some(c)) => a
                        .table
                        .lock()
                        .expect("adapter table lock")
                        .unload(c.host(self.sched.model()), &name),
                    _ => Err(EngineError::NotFound(format!("no adapter named {name:?}"))),
                };
                if done.is_ok() {
                    // Its id may serve another adapter later: nothing cached under it may
                    // be reused then.
                    self.sched.pool_mut().flush_cache();
                    self.publish_status();
                }
                let _ = reply.send(done);
            }
            Command::UpdateWeights { dir, reply, back } => self.update_weights(dir, reply, back),
            Command::WeightsLoaded { dir, loaded, reply } => {
                self.updating = false;
                match loaded {
                    Ok(new) => self.swap = Some((dir, new, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::CancelAll => {
                let ids: Vec<SeqId> = self.by_client.values().copied().collect();
                for id in ids {
                    self.sched.cancel(id);
                }
                for cmd in std::mem::take(&mut self.held) {
                    if let Command::Submit { updates, .. } = cmd {
                        let _ = updates.send(Update::Finished {
                            reason: "cancelled",
                            text: String::new(),
                            error: None,
                            usage: Usage::default(),
                            timings: RequestTimings::default(),
                        });
                    }
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    /// Starts loading the checkpoint at `dir` beside the served weights, once the memory
    /// free is known to hold them; the loaded copy comes back through `back`.
    fn update_weights(
        &mut self,
        dir: std::path::PathBuf,
        reply: tokio::sync::oneshot::Sender<Result<WeightsVersion>>,
        back: mpsc::Sender<Command>,
    ) {
        let Some(control) = &self.control else {
            let _ = reply.send(Err(EngineError::Invalid(
                "this engine cannot update its weights".into(),
            )));
            return;
        };
        if self.updating {
            let _ = reply.send(Err(EngineError::Invalid(
                "a weight update is already loading".into(),
            )));
            return;
        }
        let (need, free) = control.memory(self.sched.model());
        if let Some(free) = free.filter(|&f| f < need as u64) {
            let _ = reply.send(Err(EngineError::Invalid(format!(
                "a second copy of the weights needs {need} bytes; {free} are free"
            ))));
            return;
        }
        self.updating = true;
        let again = dir.clone();
        let done = Box::new(move |loaded: Result<NewWeights>| {
            let _ = back.send(Command::WeightsLoaded {
                dir: again,
                loaded,
                reply,
            });
        });
        control.load_copy(self.sched.model(), dir, done);
    }

    /// Serves `new` (loaded from `dir`) from the next step.
    fn swap_weights(&mut self, dir: std::path::PathBuf, new: NewWeights) -> Result<WeightsVersion> {
        let control = self
            .control
            .as_ref()
            .ok_or_else(|| EngineError::Internal("no model control".into()))?;
        let (model, pool) = self.sched.model_and_pool_mut();
        control.swap(model, pool, new)?;
        self.publish_status();
        let a = self
            .served
            .as_ref()
            .ok_or_else(|| EngineError::Internal("no weights record".into()))?;
        let mut w = a.weights.lock().expect("weights version lock");
        w.version += 1;
        w.path = dir;
        Ok(w.clone())
    }

    fn submit(
        &mut self,
        client: u64,
        req: GenerationRequest,
        updates: tmpsc::UnboundedSender<Update>,
        follows: Option<u64>,
    ) {
        let text = self.tokenizer.as_ref().map(|t| {
            TextStream::new(t.clone(), req.stop.clone())
                .showing_controls(req.shown_controls.clone())
        });
        let stop_fn: Option<strata_sched::StopFn> = match (&self.tokenizer, req.stop.is_empty()) {
            (Some(t), false) => Some(Box::new(stop_string_test(t.clone(), req.stop.clone()))),
            _ => None,
        };
        let request = Request {
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            sampling: req.sampling,
            stop_ids: self.stop_ids.clone(),
            ignore_eos: req.ignore_eos,
            stop_sequences: Vec::new(),
            stop_fn,
            logprobs: req.logprobs,
            prompt_logprobs: req.prompt_logprobs,
            constraint: req.constraint,
            controls: req.controls,
            stop_token_ids: req.stop_token_ids,
            adapter: req.adapter.as_ref().map_or(0, |a| a.id),
            media: req.media,
        };
        // A sibling sample whose leader has already ended runs on its own.
        let id = match follows.and_then(|c| self.by_client.get(&c)) {
            Some(&leader) => self.sched.submit_sibling(request, leader),
            None => self.sched.submit(request),
        };
        self.by_client.insert(client, id);
        self.live.insert(
            id,
            Live {
                client,
                updates,
                text,
                submitted: Instant::now(),
                first_token: None,
                last_token: None,
                ended_by: None,
                _adapter: req.adapter,
            },
        );
    }

    fn event(&mut self, id: SeqId, kind: EventKind) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        let now = Instant::now();
        match kind {
            EventKind::Token {
                token,
                logprob,
                top_logprobs,
            } => {
                match live.last_token {
                    None => self
                        .metrics
                        .ttft
                        .observe((now - live.submitted).as_secs_f64()),
                    Some(prev) => self.metrics.inter_token.observe((now - prev).as_secs_f64()),
                }
                live.first_token.get_or_insert(now);
                live.last_token = Some(now);
                self.metrics
                    .generation_tokens
                    .fetch_add(1, Ordering::Relaxed);
                let text = live
                    .text
                    .as_mut()
                    .map(|t| t.push(token))
                    .unwrap_or_default();
                let sent = live.updates.send(Update::Token {
                    id: token,
                    text,
                    logprob,
                    top_logprobs,
                });
                if sent.is_err() {
                    // The client is gone; its Finished event comes with the next step.
                    self.sched.cancel(id);
                }
            }
            EventKind::PromptLogprobs { start, scores } => {
                if live
                    .updates
                    .send(Update::PromptLogprobs { start, scores })
                    .is_err()
                {
                    self.sched.cancel(id);
                }
            }
            EventKind::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                let Some(mut live) = self.live.remove(&id) else {
                    return;
                };
                self.by_client.remove(&live.client);
                let (reason, error) = match reason {
                    FinishReason::Stop => ("stop", None),
                    FinishReason::Length => ("length", None),
                    FinishReason::Cancelled => (live.ended_by.unwrap_or("cancelled"), None),
                    FinishReason::Error(e) => ("error", Some(e)),
                };
                // A stop string ends the text even when the scheduler saw another reason.
                let reason =
                    if live.text.as_ref().is_some_and(TextStream::stopped) && reason == "length" {
                        "stop"
                    } else {
                        reason
                    };
                self.metrics.finished(reason);
                self.metrics
                    .prompt_tokens
                    .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
                self.metrics
                    .cached_tokens
                    .fetch_add(cached_tokens as u64, Ordering::Relaxed);
                let text = live
                    .text
                    .as_mut()
                    .map(TextStream::finish)
                    .unwrap_or_default();
                let first = live.first_token.unwrap_or(now);
                let prompt_ms = (first - live.submitted).as_secs_f64() * 1e3;
                let predicted_ms = (now - first).as_secs_f64() * 1e3;
                let computed = prompt_tokens.saturating_sub(cached_tokens);
                let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
                // The first token comes out of the prompt pass; the rest are decode steps.
                let decoded = completion_tokens.saturating_sub(1);
                let timings = RequestTimings {
                    prompt_n: computed,
                    prompt_ms,
                    prompt_per_second: rate(computed, prompt_ms),
                    predicted_n: completion_tokens,
                    predicted_ms,
                    predicted_per_second: rate(decoded, predicted_ms),
                    cached_n: cached_tokens,
                };
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                };
                let _ = live.updates.send(Update::Finished {
                    reason,
                    text,
                    error,
                    usage,
                    timings,
                });
            }
        }
    }

    /// Ends the requests past `--request-timeout`, and those still waiting for their first
    /// step past `--queue-timeout`; their ends come with the next step.
    fn expire(&mut self, now: Instant) {
        let (total, queue) = (self.opts.request_timeout, self.opts.queue_timeout);
        if total.is_none() && queue.is_none() {
            return;
        }
        let past = |limit: Option<std::time::Duration>, since: Instant| {
            limit.is_some_and(|l| now.duration_since(since) >= l)
        };
        for (&id, live) in self.live.iter_mut() {
            if live.ended_by.is_some() {
                continue;
            }
            let why = if past(total, live.submitted) {
                "timeout"
            } else if past(queue, live.submitted)
                && live.first_token.is_none()
                && self.sched.is_waiting_to_start(id)
            {
                "queue_timeout"
            } else {
                continue;
            };
            if self.sched.cancel(id) {
                live.ended_by = Some(why);
            }
        }
    }

    /// Runs a pending rebuild once no request holds pages. Replaying the held commands can
    /// make a later rebuild pending (they keep their order), which runs at once too: the
    /// loop may next block on the channel.
    /// Swaps in loaded weights once no request runs, then lets the held requests in.
    fn try_swap(&mut self) {
        if self.swap.is_none() || self.sched.has_work() {
            return;
        }
        let Some((dir, new, reply)) = self.swap.take() else {
            return;
        };
        let _ = reply.send(self.swap_weights(dir, new));
        for cmd in std::mem::take(&mut self.held) {
            self.command(cmd);
        }
        self.publish_status();
    }

    fn try_rebuild(&mut self) {
        while self.rebuild.is_some() && !self.sched.has_work() {
            let Some(Command::Rebuild { full_pages, reply }) = self.rebuild.take() else {
                return;
            };
            let result = self.resize(full_pages);
            self.publish_status();
            let _ = reply.send(result);
            for cmd in std::mem::take(&mut self.held) {
                self.command(cmd);
            }
            self.publish_status();
        }
    }

    fn resize(&mut self, full_pages: usize) -> std::result::Result<PagePlan, String> {
        if full_pages == 0 {
            return Err("num_pages must be at least 1".into());
        }
        let pool = self.sched.pool_mut();
        let window = match pool.layout().window() {
            Some(_) => ((full_pages as f64 * self.opts.window_ratio).ceil() as usize).max(1),
            None => 0,
        };
        let plan = PagePlan {
            full: full_pages,
            window,
            page_size: self.opts.page_size,
        };
        pool.flush_cache();
        pool.rebuild(plan).map_err(|e| e.to_string())?;
        Ok(plan)
    }

    fn publish_status(&self) {
        let s = self.sched.status();
        let pool = self.sched.pool();
        let snapshot = EngineStatus {
            running: s.running,
            waiting: s.waiting + self.held.len(),
            preemptions: s.preemptions,
            overlapped_steps: s.overlapped_steps,
            drafts: s.drafts,
            masks: s.masks,
            kv: Some(s.kv),
            kv_cache_dtype: pool.layout().format().cache_dtype().name().to_string(),
            page_size: pool.page_size(),
            plan: Some(*pool.plan()),
            loras: self
                .control
                .as_ref()
                .map(|c| c.host(self.sched.model()).stats())
                .unwrap_or_default(),
        };
        if let Ok(mut st) = self.status.lock() {
            *st = snapshot;
        }
    }
}
