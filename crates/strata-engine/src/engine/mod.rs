//! The serving engine: a scheduler loop on its own thread, fed through a command channel,
//! streaming each request's tokens and text back over a channel of its own.

pub(crate) mod adapters;
mod control;
mod grammar;
mod metrics;
mod text;
mod trace;
mod warmup;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use strata_kernels::sampling::{LogitControls, SamplingParams};
use strata_kv::{CacheType, KvCacheDtype, KvLayout, KvStatus, PagePlan};
use strata_model::{Drafting, ModelRunner};
use strata_sched::{DraftStats, MaskStats, SchedulerConfig};
use strata_tokenizer::Tokenizer;
use tokio::sync::{mpsc as tmpsc, oneshot, watch};

pub use adapters::Adapter;
pub use metrics::{Histogram, Metrics, FINISH_REASONS};
pub use text::TextStream;
pub use warmup::{WarmUp, WarmUpShape};

use crate::{EngineError, LoadedModel, OnBackend, OnDevice, Placement, Prompter, Result};
use strata_kv::KvPool;
use strata_model::KvCache;

/// How the engine sizes and runs the pool and the scheduler.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Element type of the KV pool.
    pub kv_cache_dtype: KvCacheDtype,
    /// Radix keeps finished prefixes for reuse; naive does not.
    pub cache_type: CacheType,
    /// Bytes of KV memory; the pool gets the pages this buys.
    pub kv_budget_bytes: u64,
    /// Tokens a KV page holds.
    pub page_size: usize,
    /// Sliding-window pages per full-attention page.
    pub window_ratio: f64,
    /// The scheduler's budgets and policies.
    pub scheduler: SchedulerConfig,
    /// Write a CSV line for every engine step here (`trace.rs`).
    pub step_trace: Option<std::path::PathBuf>,
    /// Tokens the drafter proposes a speculative round, when the model has one
    /// ([`LoadedModel::load_draft`]); 0 serves without drafts.
    pub draft_tokens: usize,
    /// Requests that may wait for a place beside the running ones; past it `submit`
    /// refuses with [`EngineError::QueueFull`]. `None`: no limit.
    pub max_waiting_requests: Option<usize>,
    /// A request running longer than this (from its arrival at the engine) is ended with
    /// reason "timeout". `None`: no limit beyond its token limit.
    pub request_timeout: Option<Duration>,
    /// A request that waits longer than this for its first step is ended with reason
    /// "queue_timeout", so a client learns soon that the server is saturated.
    pub queue_timeout: Option<Duration>,
    /// The longest request (prompt and output) accepted: at most the model's context.
    /// `None`: the model's context.
    pub max_model_len: Option<usize>,
    /// LoRA adapters loaded at start, as `(name, directory)`.
    pub loras: Vec<(String, std::path::PathBuf)>,
    /// Adapters on the device at once, which is also how many one step may name; the
    /// others wait in host memory and are uploaded when a step names them.
    pub max_loras: usize,
    /// Adapters loaded (in host memory) at once at most (at most 127).
    pub max_cpu_loras: usize,
    /// The largest adapter rank accepted.
    pub max_lora_rank: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            kv_cache_dtype: KvCacheDtype::Auto,
            cache_type: CacheType::Radix,
            kv_budget_bytes: 1 << 30,
            page_size: 16,
            window_ratio: strata_kv::DEFAULT_WINDOW_RATIO,
            scheduler: SchedulerConfig::default(),
            step_trace: None,
            draft_tokens: 3,
            max_waiting_requests: None,
            request_timeout: None,
            queue_timeout: None,
            max_model_len: None,
            loras: Vec::new(),
            max_loras: 8,
            max_cpu_loras: 32,
            max_lora_rank: 64,
        }
    }
}

/// One generation request as the server hands it over (already tokenized and validated).
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Completion tokens at most.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: SamplingParams,
    /// Text stop strings; the returned text ends before the first one found.
    pub stop: Vec<String>,
    /// Keep generating past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Log-probability of each token plus this many alternatives.
    pub logprobs: Option<usize>,
    /// Also each prompt token's log-probability given the tokens before it, with this many
    /// alternatives ([`Update::PromptLogprobs`]); the prompt is then computed whole (no
    /// prefix-cache hit), and `max_tokens` may be 0.
    pub prompt_logprobs: Option<usize>,
    /// What the output may be ([`Engine::constraint`]); `None` for free text.
    pub constraint: Option<strata_sched::Constraint>,
    /// Bias, penalties and `min_tokens`, applied to the logits before each draw.
    pub controls: LogitControls,
    /// Token ids that end the request (finish reason "stop"), also with `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Control tokens whose text goes into the output, which otherwise leaves control
    /// tokens out: a tool-call format's markers (Gemma-4's `<|tool_call>`), for the server
    /// to find the calls in the text.
    pub shown_controls: Vec<u32>,
    /// The LoRA adapter the request runs with ([`Engine::adapter`]); `None` for the base
    /// model. Held while the request runs, so the adapter cannot be unloaded under it.
    pub adapter: Option<Arc<Adapter>>,
    /// Media rows the model reads in place of prompt ids ([`crate::MediaEncoder::place`]).
    pub media: Vec<strata_sched::MediaInput>,
}

impl GenerationRequest {
    /// Greedy generation of up to `max_tokens` after `prompt`, ending at the model's
    /// end-of-sequence ids, with no stop strings, logprobs, controls or constraint.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            controls: LogitControls::default(),
            stop_token_ids: Vec::new(),
            shown_controls: Vec::new(),
            adapter: None,
            media: Vec::new(),
        }
    }
}

/// What the client of one request receives, in order: tokens, then one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// Log-probabilities of prompt tokens `start..start + scores.len()` (requests with
    /// `prompt_logprobs`), each given the tokens before it; they come before any token, in
    /// order, starting at 1 (the first token has none).
    PromptLogprobs {
        /// Position of the first prompt token scored here.
        start: usize,
        /// Each token's logprob and top alternatives.
        scores: Vec<strata_kernels::sampling::TokenLogprobs>,
    },
    /// One generated token.
    Token {
        /// The token id.
        id: u32,
        /// Text that became final with this token (may be empty: held-back bytes of a
        /// character or of a possible stop string).
        text: String,
        /// The token's log-probability, when the request asked for logprobs.
        logprob: Option<f32>,
        /// The most likely tokens with their log-probabilities, most likely first (empty
        /// unless asked for).
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request's last update.
    Finished {
        /// One of [`FINISH_REASONS`]: "stop", "length", "cancelled", "error", "timeout" or
        /// "queue_timeout".
        reason: &'static str,
        /// Remaining text (after a stop string is cut, or held-back bytes).
        text: String,
        /// What went wrong, when `reason` is "error".
        error: Option<String>,
        /// Token counts of the request.
        usage: Usage,
        /// Where the request's time went.
        timings: RequestTimings,
    },
}

/// Token counts of one finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Per-request timings (`--enable-timings-report`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestTimings {
    /// Prompt tokens computed (those not served from the prefix cache).
    pub prompt_n: usize,
    /// Milliseconds from the request's arrival at the engine to its first token.
    pub prompt_ms: f64,
    /// `prompt_n` a second over `prompt_ms`.
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Milliseconds from the first token to the last.
    pub predicted_ms: f64,
    /// Decoded tokens (all but the first) a second over `predicted_ms`.
    pub predicted_per_second: f64,
    /// Prompt tokens served from the prefix cache.
    pub cached_n: usize,
}

/// The latest figures, refreshed by the engine thread after every step.
#[derive(Clone, Debug, Default)]
pub struct EngineStatus {
    /// Requests the scheduler is running.
    pub running: usize,
    /// Requests waiting for admission (those held back by a rebuild included).
    pub waiting: usize,
    /// Preemptions since the start.
    pub preemptions: u64,
    /// Decode steps queued before the step ahead of them was read (`--overlap`).
    pub overlapped_steps: u64,
    /// Speculative rounds and their drafts (`--draft`).
    pub drafts: DraftStats,
    /// Grammar masks computed on the host (constrained requests).
    pub masks: MaskStats,
    /// The KV pool's pages and prefix cache; `None` until the engine thread first reports.
    pub kv: Option<KvStatus>,
    /// Name of the KV pool's element type.
    pub kv_cache_dtype: String,
    /// Tokens a KV page holds.
    pub page_size: usize,
    /// Pages of the pool, by attention kind; `None` until the engine thread first reports.
    pub plan: Option<PagePlan>,
    /// LoRA adapters loaded, on the device, and uploads to it so far.
    pub loras: strata_model::LoraStats,
}

pub(crate) enum Command {
    Submit {
        client: u64,
        // Boxed: a request (with its logit controls) is far larger than the other commands.
        req: Box<GenerationRequest>,
        updates: tmpsc::UnboundedSender<Update>,
        /// The client whose request this one is another sample of (same prompt).
        follows: Option<u64>,
    },
    Cancel(u64),
    /// Resize the pool to this many full-attention pages once no request holds pages.
    Rebuild {
        full_pages: usize,
        reply: oneshot::Sender<std::result::Result<PagePlan, String>>,
    },
    Flush(oneshot::Sender<usize>),
    /// Load the adapter in `dir` as `name` (on the engine thread, which owns the backend).
    LoadAdapter {
        name: String,
        dir: std::path::PathBuf,
        reply: oneshot::Sender<Result<Arc<Adapter>>>,
    },
    /// Unload adapter `name` and drop the cached prefixes computed with it.
    UnloadAdapter {
        name: String,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Load the checkpoint at `dir` beside the served weights, then serve it; `back`
    /// carries the loaded copy to the engine thread.
    UpdateWeights {
        dir: std::path::PathBuf,
        reply: oneshot::Sender<Result<WeightsVersion>>,
        back: mpsc::Sender<Command>,
    },
    /// The copy `UpdateWeights` loaded (or why not), to swap in between steps.
    WeightsLoaded {
        dir: std::path::PathBuf,
        loaded: Result<control::NewWeights>,
        reply: oneshot::Sender<Result<WeightsVersion>>,
    },
    /// Ends every request, queued or running, as cancelled (a shutdown's drain ran out).
    CancelAll,
    Shutdown,
}

/// Which weights are served: 0 for those loaded at start, one more for each update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsVersion {
    /// Updates served since start.
    pub version: u64,
    /// Where the served weights were loaded from.
    pub path: std::path::PathBuf,
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    next_client: Arc<AtomicU64>,
    status: Arc<Mutex<EngineStatus>>,
    /// Serving counters and histograms, shared with the engine thread.
    pub metrics: Arc<Metrics>,
    /// The model's tokenizer, if it has one.
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The model's tokenizer and chat template, for preparing prompts.
    pub prompter: Prompter,
    /// The model's vision tower, when it has one and it was loaded.
    pub media: Option<Arc<crate::MediaEncoder>>,
    /// The name the model is served under.
    pub model_name: String,
    /// The longest request (prompt and output) accepted, in tokens.
    pub context_len: usize,
    /// The model's vocabulary size (token ids `0..vocab_size`).
    pub vocab_size: usize,
    /// The id a constrained output ends with once its grammar is complete.
    grammar_eos: Option<u32>,
    /// Structured-output grammars over the model's vocabulary, built on first use.
    grammars: grammar::LazyGrammars,
    /// The KV pool's layout: which layers own KV, which read a source's, what a token
    /// costs (the same layout the engine thread allocates).
    pub kv_layout: Arc<KvLayout>,
    /// Sliding-window pages per full page, to price a rebuild.
    window_ratio: f64,
    /// Requests submitted and not yet ended (their guards alive), and how many may be.
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    /// The LoRA adapters served, by name.
    adapters: adapters::SharedTable,
    /// Which weights are served.
    weights: Arc<Mutex<WeightsVersion>>,
    /// False once the engine thread has ended, by a panic or a shutdown.
    alive: Arc<AtomicBool>,
    /// The same, for awaiting it.
    alive_watch: watch::Receiver<bool>,
}

/// Clears the engine's liveness when the engine thread ends, however it ends (a panic
/// unwinds through this guard too), and wakes whoever awaits [`Engine::stopped`].
struct AliveGuard(Arc<AtomicBool>, watch::Sender<bool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
        self.1.send_replace(false);
    }
}

/// Starts the engine thread over the model on its own backend (with its drafter when one
/// is loaded and drafting is asked for).
struct SpawnWorker<'a> {
    loaded: &'a LoadedModel,
    served: worker::ServedEnd,
    opts: EngineOptions,
    status: Arc<Mutex<EngineStatus>>,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Command>,
    alive: AliveGuard,
}

impl OnBackend for SpawnWorker<'_> {
    type Output = Result<std::io::Result<std::thread::JoinHandle<()>>>;

    fn run<B: Placement>(self, placed: &OnDevice<B>) -> Self::Output
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        let storage = placed.kv_storage();
        let model = placed.model.clone();
        let host = placed.model.backend().host_workers();
        let control = control::Control::<B> {
            opts: self.loaded.load_options(),
            _backend: std::marker::PhantomData,
        };
        match placed.draft.clone().filter(|_| self.opts.draft_tokens > 0) {
            Some(d) => {
                let model = Drafting::new(model, d, self.opts.draft_tokens);
                self.spawn(model, storage, Box::new(control), host)
            }
            None => self.spawn(ModelRunner(model), storage, Box::new(control), host),
        }
    }
}

impl SpawnWorker<'_> {
    /// Builds the worker over `model` (plain or drafting) and runs it on the engine thread,
    /// whose loop runs on `host`'s worker threads where the model is on the CPU.
    fn spawn<M, S>(
        self,
        model: M,
        storage: S,
        control: Box<dyn control::ModelControl<M, S>>,
        host: Option<strata_kernels::cpu::CpuBackend>,
    ) -> <Self as OnBackend>::Output
    where
        M: strata_sched::StepModel<S> + Send + 'static,
        M::Launched: Send,
        S: strata_kv::KvStorage + Send + 'static,
    {
        let Self {
            loaded,
            served,
            opts,
            status,
            metrics,
            rx,
            alive,
        } = self;
        let mut w = worker::Worker::new(loaded, model, storage, opts, status, metrics)?;
        w.served = Some(served);
        w.control = Some(control);
        Ok(std::thread::Builder::new()
            .name("strata-engine".into())
            .spawn(move || {
                let _alive = alive;
                match host {
                    Some(cpu) => cpu.run_on_workers(move || w.run(rx)),
                    None => w.run(rx),
                }
            }))
    }
}

/// Ends the engine's request when the client's stream is dropped (a disconnect).
pub struct RequestGuard {
    engine: Engine,
    client: u64,
    finished: bool,
}

impl RequestGuard {
    /// The request ended normally; dropping the guard need not cancel it.
    pub fn finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.engine.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.engine.cancel(self.client);
        }
    }
}

impl Engine {
    /// Starts the engine thread for `loaded`.
    pub fn start(loaded: LoadedModel, model_name: String, opts: EngineOptions) -> Result<Self> {
        let weights = Arc::new(Mutex::new(WeightsVersion {
            version: 0,
            path: loaded.path().to_path_buf(),
        }));
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(EngineStatus::default()));
        let metrics = Arc::new(Metrics::default());
        let tokenizer = loaded.tokenizer.clone();
        let prompter = loaded.prompter();
        let media = loaded.media.clone();
        let model_len = loaded.config().max_position_embeddings;
        let context_len = match opts.max_model_len {
            Some(0) => {
                return Err(EngineError::Invalid(
                    "max_model_len must be at least 1".into(),
                ))
            }
            Some(n) if n > model_len => {
                return Err(EngineError::Invalid(format!(
                    "max_model_len {n} exceeds the model's context of {model_len} tokens"
                )))
            }
            Some(n) => n,
            None => model_len,
        };
        let vocab_size = loaded.config().vocab_size;
        let grammar_eos = loaded.stop_ids.first().copied();
        let kv_layout = Arc::new(KvLayout::for_config(loaded.config(), opts.kv_cache_dtype)?);
        let max_in_flight = opts
            .scheduler
            .max_running_requests
            .saturating_add(opts.max_waiting_requests.unwrap_or(usize::MAX));
        let window_ratio = opts.window_ratio;
        let alive = Arc::new(AtomicBool::new(true));
        let (alive_tx, alive_watch) = watch::channel(true);
        // Adapters named at start load here, on the thread that loaded the model.
        let host = loaded.runtime.dispatch(adapters::HostOf);
        host.set_max_resident(opts.max_loras);
        let table = Arc::new(Mutex::new(adapters::AdapterTable::new(
            opts.max_cpu_loras.max(opts.max_loras),
            opts.max_lora_rank,
        )));
        for (name, dir) in &opts.loras {
            let mut t = table.lock().expect("adapter table lock");
            t.load(&*host, name, dir, &model_name)?;
        }
        let spawned = loaded.runtime.dispatch(SpawnWorker {
            loaded: &loaded,
            served: worker::ServedEnd {
                table: table.clone(),
                model_name: model_name.clone(),
                weights: weights.clone(),
            },
            opts,
            status: status.clone(),
            metrics: metrics.clone(),
            rx,
            alive: AliveGuard(alive.clone(), alive_tx),
        })?;
        spawned
            .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            tx,
            next_client: Arc::new(AtomicU64::new(1)),
            status,
            metrics,
            tokenizer,
            prompter,
            media,
            model_name,
            context_len,
            vocab_size,
            grammar_eos,
            grammars: Default::default(),
            kv_layout,
            window_ratio,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight,
            adapters: table,
            weights,
            alive,
            alive_watch,
        })
    }

    /// The constraint that keeps an output to `spec` (a JSON Schema, a regular expression,
    /// choices or a Lark grammar), compiled over the model's vocabulary; why not, when the
    /// grammar does not compile or the model has no tokenizer.
    pub fn constraint(
        &self,
        spec: &strata_structured::Spec,
    ) -> std::result::Result<strata_sched::Constraint, String> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or("structured outputs need the model's tokenizer")?;
        let eos = self
            .grammar_eos
            .ok_or("structured outputs need an end-of-sequence token")?;
        self.grammars.constraint(tokenizer, eos, spec)
    }

    /// Whether the engine thread is still running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Resolves once the engine thread has ended (a panic, or a [`shutdown`](Self::shutdown)).
    pub async fn stopped(&self) {
        let mut alive = self.alive_watch.clone();
        // An error means the thread's guard is gone, which also means it has ended.
        let _ = alive.wait_for(|running| !running).await;
    }

    /// Queues a request; its updates arrive on the returned channel. Keep the guard alive
    /// while the client listens: dropping it cancels the request.
    pub fn submit(
        &self,
        req: GenerationRequest,
    ) -> Result<(RequestGuard, tmpsc::UnboundedReceiver<Update>)> {
        self.submit_following(req, None)
    }

    /// Queues `req` as another sample of the prompt of `leader` (a request submitted
    /// before it with the same prompt, `n` > 1): it starts once `leader`'s prompt is
    /// computed and reuses its cached whole pages instead of computing them again
    /// ([`strata_sched::Scheduler::submit_sibling`]). Otherwise as [`submit`](Self::submit).
    pub fn submit_sibling(
        &self,
        req: GenerationRequest,
        leader: &RequestGuard,
    ) -> Result<(RequestGuard, tmpsc::UnboundedReceiver<Update>)> {
        self.submit_following(req, Some(leader.client))
    }

    fn submit_following(
        &self,
        req: GenerationRequest,
        follows: Option<u64>,
    ) -> Result<(RequestGuard, tmpsc::UnboundedReceiver<Update>)> {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.metrics
                .requests_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::QueueFull(self.max_in_flight));
        }
        // From here the guard owns the place taken above.
        let guard = RequestGuard {
            engine: self.clone(),
            client: self.next_client.fetch_add(1, Ordering::Relaxed),
            finished: false,
        };
        let client = guard.client;
        let (updates, rx) = tmpsc::unbounded_channel();
        self.tx
            .send(Command::Submit {
                client,
                req: Box::new(req),
                updates,
                follows,
            })
            .map_err(|_| EngineError::Stopped)?;
        Ok((guard, rx))
    }

    /// Prompt ids for a chat conversation, with the model's template.
    pub fn encode_chat(&self, messages: &[strata_tokenizer::ChatMessage]) -> Result<Vec<u32>> {
        self.prompter.encode_chat(messages)
    }

    /// Ends request `client` early (its client went away); it finishes as cancelled.
    pub fn cancel(&self, client: u64) {
        let _ = self.tx.send(Command::Cancel(client));
    }

    /// The latest figures the engine thread published (defaults if it never did).
    pub fn status(&self) -> EngineStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Drains running requests, then resizes the pool; new requests wait meanwhile. A pool
    /// that cannot fit in memory is refused before anything drains.
    pub async fn rebuild(&self, full_pages: usize) -> Result<PagePlan> {
        if let Some(kv) = self.status().kv {
            crate::budget::check_pool_fits(&kv, full_pages, self.window_ratio)?;
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Rebuild { full_pages, reply })
            .map_err(|_| EngineError::Stopped)?;
        match tokio::time::timeout(Duration::from_secs(600), rx).await {
            Ok(Ok(Ok(plan))) => Ok(plan),
            Ok(Ok(Err(e))) => Err(EngineError::Invalid(e)),
            _ => Err(EngineError::Internal(
                "the engine did not answer the rebuild".into(),
            )),
        }
    }

    /// The loaded adapter named `name`, for [`GenerationRequest::adapter`].
    pub fn adapter(&self, name: &str) -> Option<Arc<Adapter>> {
        self.adapters.lock().expect("adapter table lock").get(name)
    }

    /// The loaded adapters, by name.
    pub fn adapters(&self) -> Vec<Arc<Adapter>> {
        self.adapters.lock().expect("adapter table lock").list()
    }

    /// Loads the PEFT adapter in `dir` as `name`, while requests keep running. Refused
    /// (400) for a taken name, past `max_loras`, or an adapter the model cannot serve.
    pub async fn load_adapter(
        &self,
        name: String,
        dir: std::path::PathBuf,
    ) -> Result<Arc<Adapter>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::LoadAdapter { name, dir, reply })
            .map_err(|_| EngineError::Stopped)?;
        rx.await
            .map_err(|_| EngineError::Internal("the engine did not answer the load".into()))?
    }

    /// Unloads adapter `name`: 404 when none is loaded by that name, refused while a
    /// request runs with it.
    pub async fn unload_adapter(&self, name: String) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::UnloadAdapter { name, reply })
            .map_err(|_| EngineError::Stopped)?;
        rx.await
            .map_err(|_| EngineError::Internal("the engine did not answer the unload".into()))?
    }

    /// Which weights are served.
    pub fn weights_version(&self) -> WeightsVersion {
        self.weights.lock().expect("weights version lock").clone()
    }

    /// Loads the checkpoint at `dir` (the served model's shapes) beside the served weights
    /// while requests keep running, then serves it from the step after (adapters kept,
    /// prefix cache flushed). Refused before anything loads when the memory free cannot
    /// hold a second copy; a failed load leaves the served weights as they were.
    pub async fn update_weights(&self, dir: std::path::PathBuf) -> Result<WeightsVersion> {
        let (reply, rx) = oneshot::channel();
        let back = self.tx.clone();
        self.tx
            .send(Command::UpdateWeights { dir, reply, back })
            .map_err(|_| EngineError::Stopped)?;
        rx.await
            .map_err(|_| EngineError::Internal("the engine did not answer the update".into()))?
    }

    /// Drops every cached prefix; returns the pages freed.
    pub async fn flush(&self) -> Result<usize> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Flush(reply))
            .map_err(|_| EngineError::Stopped)?;
        rx.await
            .map_err(|_| EngineError::Internal("the engine did not answer the flush".into()))
    }

    /// Ends every request, queued or running: each finishes as cancelled with what it has
    /// generated so far.
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Asks the engine thread to stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}
