//! `strata serve`: the OpenAI-compatible HTTP server.

mod api;
mod controls;
mod echo;
mod error;
mod layout;
mod listen;
mod media;
mod prom;
mod reasoning;
mod routes;
mod samples;
mod structured;
mod tokenize;
mod tools;
mod ui;

pub use listen::{listen, serve as serve_on, ConnLimits};
pub use routes::{AppState, Shared};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};
use clap::Args;
use strata_engine::{Engine, EngineOptions, KvBudget, WarmUpShape};
use strata_kv::{CacheType, KvCacheDtype, KvLayout, DEFAULT_WINDOW_RATIO};
use strata_sched::{PromptLookup, SchedulerConfig};

use crate::step_budget;

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 8 << 20;

/// A feature that is on by default where it pays (on a GPU).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// On a GPU, off on the CPU.
    Auto,
    /// On, on any device.
    On,
    /// Off.
    Off,
}

impl Switch {
    /// Whether the feature is on, for a model on a GPU or not.
    pub fn on(self, on_gpu: bool) -> bool {
        match self {
            Switch::Auto => on_gpu,
            Switch::On => true,
            Switch::Off => false,
        }
    }
}

/// A feature that is on or off whatever the device.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// `strata serve`'s flags.
#[derive(Args, Clone)]
pub struct ServeArgs {
    /// A model directory, `config.json`, or `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// The model name clients use (default: the file or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// A PEFT LoRA adapter served beside the model, as NAME=DIR (repeatable): a request
    /// with `model: NAME` runs with it. More load at run time through
    /// `POST /v1/load_lora_adapter` (with `--admin-api-key`).
    #[arg(long = "lora", value_name = "NAME=DIR")]
    pub loras: Vec<String>,
    /// LoRA adapters on the device at once, which is also how many one step may name; the
    /// others wait in host memory and are uploaded when a step needs them.
    #[arg(long, default_value_t = 8)]
    pub max_loras: usize,
    /// LoRA adapters loaded (in host memory) at once at most (up to 127).
    #[arg(long, default_value_t = 32)]
    pub max_cpu_loras: usize,
    /// The largest LoRA rank accepted.
    #[arg(long, default_value_t = 64)]
    pub max_lora_rank: usize,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests holding KV at once (on a GPU, decode batches up to 256 replay captured
    /// graphs; a lower cap holds a busy server to smaller, less efficient steps).
    #[arg(long, default_value_t = 256)]
    pub max_running_requests: usize,
    /// Tokens per forward pass (decode tokens and prefill chunks together; default 8192 on
    /// a GPU, 2048 on the CPU).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Prompt tokens of one request per step (default: the whole step budget on a GPU, 512
    /// on the CPU).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// radix (reuse cached prefixes) or naive.
    #[arg(long, default_value = "radix")]
    pub cache_type: CacheType,
    /// Bytes of KV memory (default: --mem-fraction of available memory).
    #[arg(long)]
    pub kv_budget_bytes: Option<u64>,
    /// Fraction of memory for KV when --kv-budget-bytes is not given: of free device
    /// memory after the weights on a GPU (default 0.85), of available host memory on the
    /// CPU (default 0.1).
    #[arg(long)]
    pub mem_fraction: Option<f64>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Sliding-window pool size as a fraction of the full pool.
    #[arg(long, default_value_t = DEFAULT_WINDOW_RATIO)]
    pub swa_ratio: f64,
    /// Add per-request `timings` to every response.
    #[arg(long)]
    pub enable_timings_report: bool,
    /// Run every decode batch size and a full prefill step once before listening (CUDA
    /// graphs captured, GEMM kernels loaded): auto (on a GPU), on or off.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    pub warmup: Switch,
    /// Queue each decode step before reading the one ahead of it, its token ids fed
    /// from that step's output on the device, so the GPU does not wait for the host
    /// between steps: auto (on a GPU), on or off.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    pub overlap: Switch,
    /// Write one CSV line for every engine step to this file (start and length in ms, the
    /// host's time queueing it, the rows and prompt tokens it queued, whether it was
    /// overlapped, requests running and waiting, tokens drafted): where a served run's
    /// time goes.
    #[arg(long)]
    pub step_trace: Option<std::path::PathBuf>,
    /// A draft model for speculative decoding (Gemma-4's assistant: its directory or a
    /// `gemma4-assistant` GGUF): while at most --draft-max-requests requests run (greedy or
    /// sampled), each step drafts --draft-tokens tokens a request and checks them in one
    /// step of the model. Output is what the model alone gives; a request whose drafts are
    /// mostly rejected pauses drafting.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Speculative decoding without a draft model: each request's drafts are the tokens
    /// that followed the latest earlier occurrence of its last N tokens (down to 2) in its
    /// own prompt and output, checked as any draft is. Pays where texts repeat (code
    /// edits, quotes, summaries); costs nothing where nothing matches. Not with --draft.
    #[arg(long, value_name = "N")]
    pub prompt_lookup: Option<usize>,
    /// Tokens drafted a round (with --draft or --prompt-lookup).
    #[arg(long, default_value_t = 3)]
    pub draft_tokens: usize,
    /// Speculative rounds run while at most this many requests are running (with
    /// --draft or --prompt-lookup); past it steps decode plainly.
    #[arg(long, default_value_t = 4)]
    pub draft_max_requests: usize,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long, env = "STRATA_API_KEY")]
    pub api_key: Option<String>,
    /// Require `Authorization: Bearer KEY` on the operator's routes (`/v1/cache/rebuild`,
    /// `/v1/cache/flush`); without it those routes are off.
    #[arg(long, env = "STRATA_ADMIN_API_KEY")]
    pub admin_api_key: Option<String>,
    /// Requests that may wait for a place beside the running ones; past it a request
    /// gets 429 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting_requests: usize,
    /// Seconds a request may run, from its arrival at the engine, before it is ended: 504,
    /// or an error event on a stream. 0: no limit beyond its max_tokens.
    #[arg(long, default_value_t = 0.0)]
    pub request_timeout: f64,
    /// Seconds a request may wait for its first step before it is refused with 503 and
    /// Retry-After (an error event on a stream), telling clients early that the server is
    /// saturated. 0: no limit.
    #[arg(long, default_value_t = 0.0)]
    pub queue_timeout: f64,
    /// The longest request accepted, prompt and output together (default: the model's
    /// context). Also the smallest pool a rebuild may leave.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Bytes of prompt text accepted (a chat: its messages' texts together); past it a
    /// request is refused with 400 before it is tokenized. Default: 64 bytes for each token
    /// of --max-model-len, at most the 8 MiB body limit.
    #[arg(long)]
    pub max_prompt_bytes: Option<usize>,
    /// Seconds a shutdown (SIGTERM or SIGINT) lets in-flight requests run before ending
    /// them with finish_reason "abort".
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Seconds a client has to send a request's headers; a kept-alive connection idle for
    /// as long is closed.
    #[arg(long, default_value_t = 30.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 60.0)]
    pub body_timeout: f64,
    /// Connections open at once; more wait until one closes.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Origins a browser page may call the API from (CORS), comma-separated, or `*`.
    /// Off by default: browsers then refuse cross-origin calls.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Serve the page at `/`: a chat with the model and a live view of its KV pool
    /// (on or off; off: `/` answers 404).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub ui: OnOff,
    /// The tool-call format the model's output is read in (hermes, llama3_json, gemma4).
    /// Default: told from the chat template; a template that cannot show tools then has
    /// Strata describe them in the system turn in this format.
    #[arg(long, value_name = "FORMAT")]
    pub tool_call_parser: Option<String>,
    /// Split a chat answer's thinking into `reasoning_content` (qwen3, deepseek_r1,
    /// gemma4); off by default.
    #[arg(long, value_name = "FORMAT")]
    pub reasoning_parser: Option<String>,
    /// Media items one request may carry: `image=N,audio=M` (or JSON, `{"image": N}`).
    /// Default: image=8, audio=1.
    #[arg(long, value_name = "KIND=N,...")]
    pub limit_mm_per_prompt: Option<String>,
    /// Bytes of one image file at most (decoded from its data: URL, or fetched).
    #[arg(long, default_value_t = 5 << 20)]
    pub max_image_bytes: usize,
    /// Bytes of one audio file at most (WAV, decoded from base64).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_audio_bytes: usize,
    /// Seconds of one audio clip at most.
    #[arg(long, default_value_t = 30.0)]
    pub max_audio_seconds: f64,
    /// Hosts (exact names, comma-separated) whose http(s):// image URLs are fetched; by
    /// default none is, and images come as data: URLs.
    #[arg(long, value_delimiter = ',')]
    pub allowed_media_domains: Vec<String>,
    /// Seconds fetching one image may take.
    #[arg(long, default_value_t = 10.0)]
    pub media_fetch_timeout: f64,
    /// A Jinja chat template file that replaces the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Where and how the weights are placed.
    #[command(flatten)]
    pub placement: crate::placement::PlacementArgs,
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[strata] {}", msg.as_ref());
}

/// Runs `strata serve`: loads the model, starts the engine and serves until shut down.
pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    let kv_cache_dtype = a.kv_cache_dtype;
    let cache_type = a.cache_type;
    // Flags are checked before the (slow) load.
    a.placement.settings()?;
    if let Some(f) = a.mem_fraction {
        // Checked again with the model; here it fails before the (slow) load.
        if !(f > 0.0 && f < 1.0) {
            anyhow::bail!("--mem-fraction must be between 0 and 1");
        }
    }
    let speculative = a.draft.is_some() || a.prompt_lookup.is_some();
    if speculative && a.draft_tokens == 0 {
        anyhow::bail!("--draft-tokens must be at least 1 with --draft or --prompt-lookup");
    }
    if a.draft.is_some() && a.prompt_lookup.is_some() {
        anyhow::bail!(
            "--draft and --prompt-lookup cannot be combined: choose one source of drafts"
        );
    }
    if speculative && a.draft_max_requests == 0 {
        anyhow::bail!("--draft-max-requests must be at least 1 with --draft or --prompt-lookup");
    }
    if a.prompt_lookup == Some(0) {
        anyhow::bail!("--prompt-lookup must be at least 1 (the longest suffix matched)");
    }
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        let arg = a.model.to_string_lossy();
        // A repo id is the model's name, as clients of other servers know it.
        if !a.model.exists() && crate::hub::is_repo_id(&arg) {
            return arg.into_owned();
        }
        a.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });

    let t0 = Instant::now();
    log(format!(
        "loading {} (device {}, dtype {}, embeddings on {})",
        a.model.display(),
        a.placement.device,
        a.placement.dtype,
        format!("{:?}", a.placement.embed_weights).to_lowercase()
    ));
    let mut loaded = a
        .placement
        .load(&a.model)
        .with_context(|| format!("loading {}", a.model.display()))?;
    log(format!(
        "loaded {} ({} layers, vocab {}) on {} in {:.1} s",
        loaded.config().architecture.name(),
        loaded.config().num_layers(),
        loaded.config().vocab_size,
        loaded.runtime.device_name(),
        t0.elapsed().as_secs_f64()
    ));
    if let Some(m) = &loaded.media {
        if m.takes_images() {
            log(format!("images encoded on {}", m.image_device()));
        }
        if m.takes_audio() {
            log(format!("audio encoded on {}", m.audio_device()));
        }
    }
    if let Some(path) = &a.chat_template {
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("--chat-template {}", path.display()))?;
        loaded
            .set_chat_template(&source)
            .with_context(|| format!("--chat-template {}", path.display()))?;
        log(format!("chat template from {}", path.display()));
    }
    if let Some(draft) = &a.draft {
        loaded
            .load_draft(draft)
            .with_context(|| format!("loading the draft model {}", draft.display()))?;
        log(format!(
            "draft model {}: {} tokens a round while at most {} requests run",
            draft.display(),
            a.draft_tokens,
            a.draft_max_requests
        ));
    }
    if let Some(n) = a.prompt_lookup {
        log(format!(
            "prompt lookup: suffixes of {n} tokens down to {}, {} tokens a round while at most {} requests run",
            n.min(2),
            a.draft_tokens,
            a.draft_max_requests
        ));
    }
    let budget = match a.kv_budget_bytes {
        Some(b) => KvBudget::Bytes(b),
        None => KvBudget::Fraction(a.mem_fraction),
    }
    .bytes(&loaded)
    .context("--mem-fraction")?;
    let layout = KvLayout::for_config(loaded.config(), kv_cache_dtype)?;
    for g in layout.groups() {
        log(format!(
            "kv group {}: {} slabs (layers {:?}), {} shared layers, {} bytes/token ({} if every layer kept its own)",
            g.attention.short_name(),
            g.slabs.len(),
            g.owner_layers,
            g.shared_layers.len(),
            g.unit_bytes,
            g.unit_bytes_unshared
        ));
    }
    let on_gpu = loaded.runtime.on_gpu();
    let step_tokens = step_budget::step_tokens(a.max_batch_tokens, on_gpu);
    let chunk = step_budget::chunk_tokens(a.prefill_chunk, on_gpu, step_tokens);
    log(format!(
        "steps of up to {step_tokens} tokens (decode rows and prompt chunks of up to {chunk}), {} requests running",
        a.max_running_requests
    ));
    let opts = EngineOptions {
        kv_cache_dtype,
        cache_type,
        kv_budget_bytes: budget,
        page_size: a.page_size,
        window_ratio: a.swa_ratio,
        scheduler: SchedulerConfig {
            max_running_requests: a.max_running_requests,
            max_batch_tokens: step_tokens,
            prefill_chunk: chunk,
            overlap: a.overlap.on(on_gpu),
            draft_max_requests: a.draft_max_requests,
            prompt_lookup: a
                .prompt_lookup
                .map(|n| PromptLookup::new(n, a.draft_tokens)),
            ..SchedulerConfig::default()
        },
        step_trace: a.step_trace.clone(),
        draft_tokens: a.draft_tokens,
        max_waiting_requests: Some(a.max_waiting_requests),
        request_timeout: optional_secs("--request-timeout", a.request_timeout)?,
        queue_timeout: optional_secs("--queue-timeout", a.queue_timeout)?,
        max_model_len: a.max_model_len,
        loras: parse_loras(&a.loras)?,
        max_loras: a.max_loras,
        max_cpu_loras: a.max_cpu_loras,
        max_lora_rank: a.max_lora_rank,
    };
    let warm = a.warmup.on(on_gpu);
    let engine = Engine::start(loaded, name.clone(), opts)?;
    if let Some(plan) = engine.status().plan {
        log(format!(
            "kv pool ({} bytes budget, {}): full {} pages + window {} pages of {} tokens",
            budget,
            layout.format().cache_dtype().name(),
            plan.full,
            plan.window,
            plan.page_size
        ));
    }
    if a.max_prompt_bytes == Some(0) {
        anyhow::bail!("--max-prompt-bytes must be at least 1");
    }
    let tool_parser = match &a.tool_call_parser {
        None => None,
        Some(n) => Some(tools::named(n).ok_or_else(|| {
            anyhow::anyhow!("--tool-call-parser {n:?}: not one of hermes, llama3_json, gemma4")
        })?),
    };
    let reasoning = match &a.reasoning_parser {
        None => None,
        Some(n) => Some(reasoning::ReasoningParser::by_name(n).ok_or_else(|| {
            anyhow::anyhow!("--reasoning-parser {n:?}: not one of {}", reasoning::NAMES)
        })?),
    };
    let state: Shared = Arc::new(AppState {
        api_key: a.api_key.clone(),
        max_prompt_bytes: a
            .max_prompt_bytes
            .unwrap_or_else(|| default_prompt_bytes(engine.context_len)),
        admin_api_key: a.admin_api_key.clone(),
        timings: a.enable_timings_report,
        tool_parser,
        reasoning,
        media: media_policy(a)?,
        text_model_only: a.placement.text_model_only,
        ..AppState::new(engine.clone(), name.clone())
    });
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("--host {} --port {}", a.host, a.port))?;
    let secs = |flag: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(anyhow::anyhow!(
                "{flag} must be a positive number of seconds"
            ))
        }
    };
    let conn_limits = listen::ConnLimits {
        header_timeout: secs("--header-timeout", a.header_timeout)?,
        max_connections: a.max_connections,
        shutdown_timeout: secs("--shutdown-timeout", a.shutdown_timeout)?,
    };
    let http = HttpOptions {
        body_timeout: secs("--body-timeout", a.body_timeout)?,
        allowed_origins: a.allowed_origins.clone(),
        ui: a.ui == OnOff::On,
    };
    let ui = http.ui;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if warm {
            let shape = WarmUpShape {
                max_running: a.max_running_requests,
                max_batch_tokens: step_tokens,
                prefill_chunk: chunk,
                draft_tokens: if speculative { a.draft_tokens } else { 0 },
                draft_max_requests: a.draft_max_requests,
                prompt_lookup: a.prompt_lookup.is_some(),
            };
            // A failed warm-up leaves a server that still answers (with the same error, if
            // the engine cannot run the shapes); it only costs the first requests time.
            match engine.warm_up(shape).await {
                Ok(w) => {
                    let prefill: Vec<String> =
                        w.prefill.iter().map(|(n, len)| format!("{n} x {len}")).collect();
                    log(format!(
                        "warm-up: decode steps of {:?} requests and prefill steps of {} tokens in {:.1} s",
                        w.decode_batches,
                        prefill.join(" and "),
                        w.seconds
                    ))
                }
                Err(e) => log(format!("warm-up failed, serving without it: {e}")),
            }
        }
        let (listener, bound) = listen::listen(addr).await?;
        log(format!("listening on http://{bound}"));
        if ui {
            println!("page: http://{bound}/ (chat and the KV pool, in a browser)");
        }
        println!(
            "ready: curl http://{bound}/v1/completions -H 'Content-Type: application/json' -d '{{\"model\": \"{name}\", \"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}}'"
        );
        let router = router(state.clone(), &http)?;
        listen::serve(listener, router, state, conn_limits).await?;
        engine.shutdown();
        log("stopped");
        anyhow::Ok(())
    })
}

/// `--request-timeout` and `--queue-timeout`: 0 for none.
fn optional_secs(flag: &str, v: f64) -> anyhow::Result<Option<Duration>> {
    match v {
        0.0 => Ok(None),
        v if v.is_finite() && v > 0.0 => Ok(Some(Duration::from_secs_f64(v))),
        _ => anyhow::bail!("{flag} must be a non-negative number of seconds (0: no limit)"),
    }
}

/// The prompt text accepted by default for a server of `context_len` tokens: generous
/// (real text averages about 4 bytes a token), yet it stops a prompt that could never
/// fit from costing a tokenization.
pub fn default_prompt_bytes(context_len: usize) -> usize {
    context_len.saturating_mul(64).min(MAX_BODY_BYTES)
}

/// The HTTP layers' settings, from the command line.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
    /// CORS origins (`*` for any); empty: no CORS headers.
    pub allowed_origins: Vec<String>,
    /// Serve the page at `/` (`--ui`).
    pub ui: bool,
}

/// The server's routes over `state`, with `http`'s body timeout and CORS origins.
pub fn router(state: Shared, http: &HttpOptions) -> anyhow::Result<Router> {
    let admin = Router::new()
        .route("/v1/cache/rebuild", post(routes::cache_rebuild))
        .route("/v1/cache/flush", post(routes::cache_flush))
        .route("/v1/load_lora_adapter", post(routes::load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(routes::unload_lora_adapter))
        .route("/v1/weights/update", post(routes::update_weights))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            routes::admin_auth,
        ));
    let v1 = Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/weights/version", get(routes::weights_version))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/cache/status", get(routes::cache_status))
        .route("/v1/kv/layout", get(layout::kv_layout))
        .route_layer(middleware::from_fn_with_state(state.clone(), routes::auth))
        .merge(admin)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            routes::count_rejections,
        ));
    let page = if http.ui { ui::routes() } else { Router::new() };
    // Room for the images a model with a vision tower may be sent.
    let body_limit = match state.engine.media {
        Some(_) => MAX_BODY_BYTES.saturating_add(state.media.body_bytes()),
        None => MAX_BODY_BYTES,
    };
    let router = Router::new()
        .merge(page)
        .route("/health", get(routes::health))
        .route("/ready", get(routes::ready))
        .route("/metrics", get(routes::metrics))
        .merge(v1)
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            http.body_timeout,
        ))
        .with_state(state);
    Ok(match cors(&http.allowed_origins)? {
        Some(layer) => router.layer(layer),
        None => router,
    })
}

/// The media flags as a policy, checked.
fn media_policy(a: &ServeArgs) -> anyhow::Result<media::MediaPolicy> {
    let mut p = media::MediaPolicy {
        max_image_bytes: a.max_image_bytes,
        max_audio_bytes: a.max_audio_bytes,
        max_audio_seconds: a.max_audio_seconds,
        allowed_domains: a.allowed_media_domains.clone(),
        ..Default::default()
    };
    if let Some(spec) = &a.limit_mm_per_prompt {
        p.set_limits(spec)
            .map_err(|e| anyhow::anyhow!("--limit-mm-per-prompt {spec:?}: {e}"))?;
    }
    if a.max_image_bytes == 0 || a.max_audio_bytes == 0 {
        anyhow::bail!("--max-image-bytes and --max-audio-bytes must be at least 1");
    }
    if !(a.max_audio_seconds.is_finite() && a.max_audio_seconds > 0.0) {
        anyhow::bail!("--max-audio-seconds must be a positive number of seconds");
    }
    if !(a.media_fetch_timeout.is_finite() && a.media_fetch_timeout > 0.0) {
        anyhow::bail!("--media-fetch-timeout must be a positive number of seconds");
    }
    p.fetch_timeout = Duration::from_secs_f64(a.media_fetch_timeout);
    Ok(p)
}

/// CORS for `--allowed-origins`: any listed origin may call every route with any method
/// and header (the API key, when set, still decides).
fn cors(origins: &[String]) -> anyhow::Result<Option<tower_http::cors::CorsLayer>> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                o.parse::<axum::http::HeaderValue>()
                    .map_err(|_| anyhow::anyhow!("--allowed-origins: {o:?} is not a valid origin"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any),
    ))
}

/// `--lora NAME=DIR` values as `(name, directory)`.
fn parse_loras(values: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    values
        .iter()
        .map(|v| match v.split_once('=') {
            Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
                Ok((name.to_string(), PathBuf::from(dir)))
            }
            _ => anyhow::bail!("--lora {v:?}: expected NAME=DIR"),
        })
        .collect()
}
