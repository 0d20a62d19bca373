//! HTTP handlers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use strata_engine::{Engine, GenerationRequest, RequestGuard, RequestTimings, Update, Usage};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{self, ChatRequest, CompletionRequest, Limits, Prompt};
use super::echo::Echo;
use super::error::ApiError;
use super::prom;
use super::reasoning::{ReasoningParser, Splitter};
use super::samples::{self, Samples, Submitted};
use super::tools::ToolOutput;

/// What every route shares.
pub struct AppState {
    /// The engine requests go to.
    pub engine: Engine,
    /// The model's name in the API (`--served-model-name`); requests naming another are
    /// refused.
    pub model_name: String,
    /// Guards the `/v1` routes; `None` leaves them open.
    pub api_key: Option<String>,
    /// Guards the operator's routes; `None` turns them off.
    pub admin_api_key: Option<String>,
    /// Set once a shutdown began: readiness answers 503 from then on.
    pub draining: AtomicBool,
    /// Add per-request `timings` to responses (`--enable-timings-report`).
    pub timings: bool,
    /// The number in the next response's id (`cmpl-N`, `chatcmpl-N`).
    pub next_id: AtomicU64,
    /// Unix seconds when the state was made (the server's start), reported as the model's
    /// `created`.
    pub created: u64,
    /// Tokenizations running at once on the blocking pool (see `tokenize`).
    pub tokenize_slots: tokio::sync::Semaphore,
    /// Bytes of prompt text a request may send (`--max-prompt-bytes`).
    pub max_prompt_bytes: usize,
    /// The longest request the server accepted at start (its context, or its pool where
    /// that holds less): a rebuild may not leave less room than this.
    pub longest_request: usize,
    /// The tool-call format `--tool-call-parser` names (default: told from the template).
    pub tool_parser: Option<&'static dyn super::tools::ToolFormat>,
    /// `--reasoning-parser`: chat answers' thinking goes to `reasoning_content`.
    pub reasoning: Option<ReasoningParser>,
    /// What media clients may send.
    pub media: super::media::MediaPolicy,
    /// Requests whose audio is being encoded: one at a time, since the audio tower takes
    /// every core (images share the vision tower's passes instead).
    pub media_slots: tokio::sync::Semaphore,
    /// Requests whose images are being decoded or wait for a tower pass: a few at once, so
    /// that their passes can be shared, and no more, which bounds the decoded pixels held.
    pub image_slots: tokio::sync::Semaphore,
    /// `--text-model-only`: a multimodal checkpoint served without its encoders.
    pub text_model_only: bool,
}

/// Tokenizations allowed at once: a long prompt takes its core for a while, and more than a
/// couple per core would only queue inside the blocking pool.
pub const TOKENIZE_SLOTS: usize = 8;

/// The state as the routes hold it.
pub type Shared = Arc<AppState>;

impl AppState {
    /// A server's state for `engine`, serving it as `model_name`: no keys, no timings,
    /// the default sliding-window ratio.
    pub fn new(engine: Engine, model_name: String) -> Self {
        let engine_context = engine.context_len;
        let pool_tokens = engine
            .status()
            .plan
            .map_or(usize::MAX, |p| p.full * p.page_size);
        let longest_request = engine_context.min(pool_tokens);
        Self {
            engine,
            model_name,
            api_key: None,
            admin_api_key: None,
            draining: AtomicBool::new(false),
            timings: false,
            next_id: AtomicU64::new(1),
            created: created_now(),
            tokenize_slots: tokio::sync::Semaphore::new(TOKENIZE_SLOTS),
            max_prompt_bytes: super::default_prompt_bytes(engine_context),
            longest_request,
            tool_parser: None,
            reasoning: None,
            media: Default::default(),
            media_slots: tokio::sync::Semaphore::new(1),
            image_slots: tokio::sync::Semaphore::new(super::media::IMAGE_REQUESTS_AT_ONCE),
            text_model_only: false,
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The current time in Unix seconds.
pub fn created_now() -> u64 {
    now_secs()
}

/// `Json<T>` whose rejections are OpenAI-style errors (400 for bad JSON or types, 413 for
/// oversized bodies, 415 for a wrong content type).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rej) => {
                let status = match rej.status() {
                    StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
                    s => s,
                };
                Err(ApiError::status(status, rej.body_text()))
            }
        }
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme's case does not
/// matter, as RFC 9110 says).
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares keys in time independent of where they differ, so that response times do not
/// reveal a key's prefix.
fn key_matches(given: Option<&str>, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())))
}

/// Runs the request when its bearer token is `key`, else answers 401 (`what` names the key).
async fn with_key(key: &str, what: &str, req: Request, next: Next) -> Response {
    if !key_matches(bearer(&req), key) {
        return ApiError::status(
            StatusCode::UNAUTHORIZED,
            format!("missing or invalid {what} (Authorization: Bearer ...)"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Bearer-token check for the `/v1` routes when `--api-key` is set.
pub async fn auth(State(st): State<Shared>, req: Request, next: Next) -> Response {
    match &st.api_key {
        Some(key) => with_key(key, "API key", req, next).await,
        None => next.run(req).await,
    }
}

/// The operator's routes: only with `--admin-api-key`, and only for that key (the
/// inference key does not open them).
pub async fn admin_auth(State(st): State<Shared>, req: Request, next: Next) -> Response {
    match &st.admin_api_key {
        Some(key) => with_key(key, "admin key", req, next).await,
        None => ApiError::status(
            StatusCode::NOT_FOUND,
            "this route is off: start the server with --admin-api-key to use it",
        )
        .into_response(),
    }
}

/// Counts `/v1` requests answered with a 4xx (`strata_requests_rejected_total`).
pub async fn count_rejections(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status().is_client_error() {
        st.engine
            .metrics
            .requests_rejected
            .fetch_add(1, Ordering::Relaxed);
    }
    resp
}

/// Liveness: the process answers and its engine thread runs (503 once it has died).
pub async fn health(State(st): State<Shared>) -> Response {
    probe(&st, false)
}

/// Readiness: the model is loaded and the server takes requests (503 while draining).
pub async fn ready(State(st): State<Shared>) -> Response {
    probe(&st, true)
}

fn probe(st: &AppState, readiness: bool) -> Response {
    let (status, word) = if !st.engine.is_alive() {
        (StatusCode::SERVICE_UNAVAILABLE, "engine stopped")
    } else if st.draining.load(Ordering::SeqCst) {
        // Liveness too: a load balancer that probes /health stops sending at once.
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (StatusCode::OK, if readiness { "ready" } else { "ok" })
    };
    (status, Json(json!({"status": word}))).into_response()
}

fn model_card(st: &AppState) -> Value {
    json!({
        "id": st.model_name,
        "object": "model",
        "created": st.created,
        "owned_by": "strata",
        "max_model_len": st.engine.context_len,
        "has_chat_template": st.engine.prompter.has_chat_template(),
    })
}

/// A LoRA adapter's card, as vLLM lists one: its base model as `parent`, its directory as
/// `root`.
fn adapter_card(st: &AppState, a: &strata_engine::Adapter) -> Value {
    json!({
        "id": a.name,
        "object": "model",
        "created": st.created,
        "owned_by": "strata",
        "root": a.path.display().to_string(),
        "parent": st.model_name,
        "max_model_len": st.engine.context_len,
        "lora": {"rank": a.info.rank, "alpha": a.info.alpha, "rslora": a.info.rslora},
    })
}

pub async fn models(State(st): State<Shared>) -> Json<Value> {
    let mut data = vec![model_card(&st)];
    data.extend(st.engine.adapters().iter().map(|a| adapter_card(&st, a)));
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: the served model or one of its adapters, or 404 for any other id.
pub async fn model(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(match resolve_model(&st, &Some(id))? {
        Some(a) => adapter_card(&st, &a),
        None => model_card(&st),
    }))
}

/// `POST /v1/load_lora_adapter` (vLLM's shape: `{"lora_name", "lora_path"}`): loads a PEFT
/// adapter while requests keep running. An operator's route (`--admin-api-key`).
pub async fn load_lora_adapter(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<LoraLoad>,
) -> Result<Json<Value>, ApiError> {
    let path = std::path::PathBuf::from(&body.lora_path);
    if body.load_inplace {
        // Replaces an adapter of that name (refused below if a request still holds it).
        let _ = st.engine.unload_adapter(body.lora_name.clone()).await;
    }
    let a = st
        .engine
        .load_adapter(body.lora_name, path)
        .await
        .map_err(|e| super::error::about("lora_path", e))?;
    Ok(Json(adapter_card(&st, &a)))
}

/// `POST /v1/unload_lora_adapter` (`{"lora_name"}`): 404 for a name not loaded; refused
/// while a request runs with the adapter.
pub async fn unload_lora_adapter(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<LoraUnload>,
) -> Result<Json<Value>, ApiError> {
    let name = body.lora_name;
    st.engine
        .unload_adapter(name.clone())
        .await
        .map_err(|e| super::error::about("lora_name", e))?;
    Ok(Json(json!({"unloaded": name})))
}

/// `POST /v1/weights/update` (SGLang's `update_weights_from_disk` shape: `{"path"}` or
/// `{"model_path"}`): loads a checkpoint of the served model's shapes beside the served
/// weights while requests keep running, then serves it. An operator's route.
pub async fn update_weights(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<WeightsUpdate>,
) -> Result<Json<Value>, ApiError> {
    let path = match (body.path, body.model_path) {
        (Some(p), None) | (None, Some(p)) => p,
        _ => return Err(ApiError::invalid("path", "give one of path and model_path")),
    };
    if body.load_format.as_deref().is_some_and(|f| f != "auto") {
        return Err(ApiError::invalid(
            "load_format",
            "only \"auto\" is supported",
        ));
    }
    let v = st
        .engine
        .update_weights(std::path::PathBuf::from(path))
        .await
        .map_err(|e| super::error::about("path", e))?;
    Ok(Json(json!({
        "success": true,
        "message": format!("serving weights version {}", v.version),
        "version": v.version,
        "path": v.path.display().to_string(),
    })))
}

/// `GET /v1/weights/version`: which weights are served (0: those loaded at start).
pub async fn weights_version(State(st): State<Shared>) -> Json<Value> {
    let v = st.engine.weights_version();
    Json(json!({"version": v.version, "path": v.path.display().to_string()}))
}

/// The body of `POST /v1/weights/update`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsUpdate {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    model_path: Option<String>,
    #[serde(default)]
    load_format: Option<String>,
}

/// The body of `POST /v1/load_lora_adapter`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraLoad {
    lora_name: String,
    lora_path: String,
    /// vLLM's flag for loading in place; accepted when false.
    #[serde(default)]
    load_inplace: bool,
}

/// The body of `POST /v1/unload_lora_adapter`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraUnload {
    lora_name: String,
    /// vLLM's adapter id field; ignored (names identify adapters here).
    #[serde(default)]
    #[allow(dead_code)]
    lora_int_id: Option<u64>,
}

pub async fn metrics(State(st): State<Shared>) -> Response {
    let body = prom::render(&st.engine);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub async fn cache_status(State(st): State<Shared>) -> Result<Json<Value>, ApiError> {
    let s = st.engine.status();
    let kv = s.kv.ok_or_else(|| {
        ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine is starting")
    })?;
    let pool = |kind: &str| {
        kv.pools
            .iter()
            .find(|p| serde_json::to_value(p.pool).ok() == Some(json!(kind)))
    };
    let full = pool("full");
    let window = pool("window");
    let unit_bytes: Vec<Value> = kv
        .pools
        .iter()
        .map(|p| json!({"attention": p.attention, "window": p.window, "unit_bytes": p.unit_bytes}))
        .collect();
    Ok(Json(json!({
        "num_pages": full.map_or(0, |p| p.pages_total),
        "window_num_pages": window.map_or(0, |p| p.pages_total),
        "page_size": kv.page_size,
        "free_pages": full.map_or(0, |p| p.pages_free),
        "window_free_pages": window.map_or(0, |p| p.pages_free),
        "used_pages": full.map_or(0, |p| p.pages_used),
        "window_used_pages": window.map_or(0, |p| p.pages_used),
        "cached_pages": full.map_or(0, |p| p.pages_cached),
        "window_cached_pages": window.map_or(0, |p| p.pages_cached),
        "window_idle_pages": window.map_or(0, |p| p.pages_evictable),
        "window_past_window_pages": kv.window_pages_past_window,
        "window_evicted_pages": kv.window_pages_evicted,
        "window_hits": kv.window_hits,
        "window_hit_tokens": kv.window_hit_tokens,
        "unit_bytes": unit_bytes,
        "kv_cache_dtype": kv.kv_cache_dtype,
        "cache_type": kv.cache_type,
        "cached_tokens": kv.cached_tokens,
        "cache_hits": kv.cache_hits,
        "cache_misses": kv.cache_misses,
        "hit_tokens": kv.hit_tokens,
        "lookup_tokens": kv.lookup_tokens,
        "running_requests": s.running,
        "waiting_requests": s.waiting,
        "bytes_reserved": kv.bytes_reserved,
    })))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebuildBody {
    num_pages: usize,
}

pub async fn cache_rebuild(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<RebuildBody>,
) -> Result<Json<Value>, ApiError> {
    if body.num_pages == 0 {
        return Err(ApiError::invalid(
            "num_pages",
            "num_pages must be at least 1",
        ));
    }
    check_rebuild_floor(&st, body.num_pages)?;
    let plan = st
        .engine
        .rebuild(body.num_pages)
        .await
        .map_err(|e| super::error::about("num_pages", e))?;
    Ok(Json(
        json!({"num_pages": plan.full, "window_num_pages": plan.window, "page_size": plan.page_size}),
    ))
}

/// Refuses a pool too small for the longest request the server accepted at start: after it,
/// requests that clients were promised (`max_model_len`) would be refused.
fn check_rebuild_floor(st: &AppState, num_pages: usize) -> Result<(), ApiError> {
    let Some(page) = st.engine.status().plan.map(|p| p.page_size) else {
        return Ok(());
    };
    let floor = st.longest_request.div_ceil(page.max(1));
    if num_pages < floor {
        return Err(ApiError::invalid(
            "num_pages",
            format!(
                "{num_pages} pages hold {} tokens; the server accepted requests of {} tokens at start, which need at least {floor} pages (lower --max-model-len for smaller pools)",
                num_pages * page,
                st.longest_request
            ),
        ));
    }
    Ok(())
}

pub async fn cache_flush(State(st): State<Shared>) -> Result<Json<Value>, ApiError> {
    let freed = st.engine.flush().await?;
    Ok(Json(json!({"flushed_pages": freed})))
}

pub async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "no such endpoint")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}

fn limits(st: &AppState) -> Limits {
    let s = st.engine.status();
    let pool_tokens = s.plan.map_or(usize::MAX, |p| p.full * p.page_size);
    Limits {
        context_len: st.engine.context_len,
        pool_tokens,
        vocab_size: st.engine.vocab_size,
    }
}

pub(super) fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    resolve_model(st, model).map(|_| ())
}

/// What `model` names: the served model (`None`, also when absent), or one of its LoRA
/// adapters; 404 for anything else.
pub(super) fn resolve_model(
    st: &AppState,
    model: &Option<String>,
) -> Result<Option<Arc<strata_engine::Adapter>>, ApiError> {
    match model {
        Some(m) if m != &st.model_name => match st.engine.adapter(m) {
            Some(a) => Ok(Some(a)),
            None => Err(ApiError::status(
                StatusCode::NOT_FOUND,
                format!(
                    "model {m:?} is not served here (this server serves {:?}{})",
                    st.model_name,
                    adapter_names(st)
                ),
            )),
        },
        _ => Ok(None),
    }
}

/// ", and adapters \"a\", \"b\"" when adapters are loaded.
fn adapter_names(st: &AppState) -> String {
    let names: Vec<String> = st
        .engine
        .adapters()
        .iter()
        .map(|a| format!("{:?}", a.name))
        .collect();
    match names.is_empty() {
        true => String::new(),
        false => format!(" and adapters {}", names.join(", ")),
    }
}

pub(super) fn tokenizer(st: &AppState) -> Result<&strata_tokenizer::Tokenizer, ApiError> {
    st.engine.tokenizer.as_deref().ok_or_else(|| {
        ApiError::bad_request("this model has no tokenizer: send the prompt as token ids")
    })
}

/// Which OpenAI response shape to produce.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Completion,
    Chat,
}

pub async fn completions(
    State(st): State<Shared>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let c = req.common();
    let adapter = resolve_model(&st, &c.model)?;
    req.check_unsupported()?;
    let mut prompts = match &req.prompt {
        Prompt::Tokens(ids) => vec![ids.clone()],
        Prompt::Text(t) => vec![encode_text(&st, t).await?],
        Prompt::Texts(v) => {
            check_prompt_count(v.len())?;
            let bytes = v.iter().map(String::len).sum();
            check_prompt_bytes(&st, "prompt", bytes)?;
            let mut ids = Vec::with_capacity(v.len());
            for t in v {
                ids.push(encode_text(&st, t).await?);
            }
            ids
        }
        Prompt::TokenLists(v) => {
            check_prompt_count(v.len())?;
            v.clone()
        }
    };
    let logprobs = req.logprobs.map(|n| n as usize);
    let echo = req.echo();
    super::echo::check_not_streamed(echo, c.stream)?;
    let samples = Samples::parse(c.n, req.best_of, c.stream, prompts.len(), MAX_PROMPTS)?;
    if echo || prompts.len() > 1 {
        // `echo` with `stream` is refused above: here the stream asked for several prompts.
        if c.stream {
            return Err(ApiError::invalid(
                "stream",
                "streaming answers one prompt at a time: send several prompts unstreamed",
            ));
        }
        // The prompts as sent, for `echo` (token ids are decoded).
        let texts: Vec<Option<String>> = match &req.prompt {
            Prompt::Text(t) => vec![Some(t.clone())],
            Prompt::Texts(v) => v.iter().cloned().map(Some).collect(),
            Prompt::Tokens(_) | Prompt::TokenLists(_) => vec![None; prompts.len()],
        };
        let lim = limits(&st);
        let mut gens = Vec::with_capacity(prompts.len());
        let mut echoes = Vec::with_capacity(prompts.len());
        for (ids, text) in prompts.into_iter().zip(texts) {
            let shown = match (echo, text) {
                (false, _) => None,
                (true, Some(text)) => Some(Echo {
                    text,
                    ids: ids.clone(),
                }),
                (true, None) => Some(Echo {
                    text: tokenizer(&st)?
                        .decode(&ids, false)
                        .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
                    ids: ids.clone(),
                }),
            };
            let mut gen = api::build_completion(&c, ids, logprobs, echo, &lim)?;
            gen.adapter = adapter.clone();
            gens.push(gen);
            echoes.push(shown);
        }
        super::structured::constrain(&st, &c, &mut gens).await?;
        return collect_many(st, gens, echoes, logprobs.is_some(), samples).await;
    }
    let prompt = prompts.pop().unwrap_or_default();
    let mut gen = api::build_completion(&c, prompt, logprobs, false, &limits(&st))?;
    gen.adapter = adapter;
    super::structured::constrain(&st, &c, std::slice::from_mut(&mut gen)).await?;
    respond(st, gen, Kind::Completion, &c, samples, None).await
}

async fn encode_text(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    tokenizer(st)?;
    check_prompt_bytes(st, "prompt", text.len())?;
    let text = text.to_string();
    tokenize_on_pool(st, move |p| p.encode_prompt(&text))
        .await
        .map_err(|e| super::error::about("prompt", e))
}

/// Prompts one completions request may carry: each is a request in the engine.
pub const MAX_PROMPTS: usize = 256;

fn check_prompt_count(n: usize) -> Result<(), ApiError> {
    match n {
        0 => Err(ApiError::invalid("prompt", "the list of prompts is empty")),
        n if n > MAX_PROMPTS => Err(ApiError::invalid(
            "prompt",
            format!("{n} prompts in one request; at most {MAX_PROMPTS}"),
        )),
        _ => Ok(()),
    }
}

/// Refuses prompt text past `--max-prompt-bytes` before any tokenizing is spent on it.
pub(super) fn check_prompt_bytes(
    st: &AppState,
    param: &'static str,
    bytes: usize,
) -> Result<(), ApiError> {
    if bytes > st.max_prompt_bytes {
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt has {bytes} bytes of text; this server accepts at most {} (--max-prompt-bytes)",
                st.max_prompt_bytes
            ),
        ));
    }
    Ok(())
}

/// Runs a tokenization on tokio's blocking pool, a bounded number at a time, so that a long
/// prompt never holds an async worker (and with it `/health` and every stream it serves).
pub(super) async fn tokenize_on_pool<T: Send + 'static>(
    st: &AppState,
    f: impl FnOnce(&strata_engine::Prompter) -> strata_engine::Result<T> + Send + 'static,
) -> strata_engine::Result<T> {
    let _slot = st
        .tokenize_slots
        .acquire()
        .await
        .map_err(|_| strata_engine::EngineError::Stopped)?;
    let prompter = st.engine.prompter.clone();
    tokio::task::spawn_blocking(move || f(&prompter))
        .await
        .map_err(|e| strata_engine::EngineError::Internal(format!("tokenization failed: {e}")))?
}

pub async fn chat(
    State(st): State<Shared>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let c = req.common();
    let adapter = resolve_model(&st, &c.model)?;
    req.check_unsupported()?;
    let (messages, media_parts) = req.messages(&st.media)?;
    super::media::check_taken(&st, &media_parts)?;
    let kwargs = req.template_kwargs()?;
    let bytes = messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .as_ref()
                    .map_or(0, |c| Value::from(c.clone()).to_string().len())
        })
        .sum();
    check_prompt_bytes(&st, "messages", bytes)?;
    let plan = super::tools::plan(&req, st.engine.prompter.chat_template(), st.tool_parser)?;
    let forced = match &plan {
        Some(p) => {
            super::tools::check_schemas(&st, &p.tools).await?;
            let tok = st.engine.tokenizer.as_deref();
            super::tools::forced(p, &|m: &str| tok.and_then(|t| t.token_id(m)))?
        }
        None => None,
    };
    if forced.is_some() {
        if let Some((field, _)) = super::structured::requested(&c)? {
            return Err(ApiError::invalid(
                field,
                format!("{field} and tool_choice both constrain the output: send one"),
            ));
        }
    }
    let (messages, mut options) = match &plan {
        Some(p) => super::tools::render_input(p, messages),
        None => (messages, strata_tokenizer::ChatOptions::default()),
    };
    options.kwargs = kwargs;
    let prompt = tokenize_on_pool(&st, move |p| p.encode_chat_with(&messages, &options))
        .await
        .map_err(|e| super::error::about("messages", e))?;
    let media_rows = super::media::encode_media(&st, media_parts).await?;
    let (prompt, media) = match (&st.engine.media, media_rows.is_empty()) {
        (Some(enc), false) => enc
            .place(&prompt, &media_rows)
            .map_err(|e| super::error::about("messages", e))?,
        _ => (prompt, Vec::new()),
    };
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        (false, None) => None,
    };
    // Chat has no length default in OpenAI's API: let the answer run to the context.
    let room = limits(&st)
        .context_len
        .min(limits(&st).pool_tokens)
        .saturating_sub(prompt.len());
    let default_max = Some(room.min(u32::MAX as usize) as u32);
    let samples = Samples::parse(c.n, None, c.stream, 1, MAX_PROMPTS)?;
    let mut gen = api::build(&c, prompt, logprobs, default_max, &limits(&st))?;
    gen.adapter = adapter;
    gen.media = media;
    match forced {
        Some(spec) => {
            gen.constraint = Some(super::structured::compile(&st, "tool_choice", spec).await?)
        }
        None => super::structured::constrain(&st, &c, std::slice::from_mut(&mut gen)).await?,
    }
    // Calls are read from the output unless tool_choice is "none"; the format's markers
    // that are control tokens keep their text for that.
    if let (Some(p), Some(tok)) = (&plan, st.engine.tokenizer.as_deref()) {
        if p.choice != super::tools::Choice::None {
            gen.shown_controls = p
                .format
                .control_markers()
                .iter()
                .filter_map(|m| tok.token_id(m))
                .collect();
        }
    }
    // So are the thinking markers, for the reasoning split.
    if let (Some(r), Some(tok)) = (st.reasoning, st.engine.tokenizer.as_deref()) {
        let ids = r.control_markers().iter().filter_map(|m| tok.token_id(m));
        gen.shown_controls.extend(ids);
    }
    let tools = plan
        .filter(|p| p.choice != super::tools::Choice::None)
        .map(|p| ToolOutput { format: p.format });
    respond(st, gen, Kind::Chat, &c, samples, tools).await
}

/// Submits `gen`'s samples and answers as `c` asks: streamed (with usage when asked) or
/// whole. With `tools`, calls in a chat's output become `tool_calls`.
async fn respond(
    st: Shared,
    gen: GenerationRequest,
    kind: Kind,
    c: &api::Common,
    samples: Samples,
    tools: Option<ToolOutput>,
) -> Result<Response, ApiError> {
    let want_logprobs = gen.logprobs.is_some();
    let submitted = samples::submit_samples(&st.engine, samples.expand(gen))?;
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Completion => format!("cmpl-{n}"),
        Kind::Chat => format!("chatcmpl-{n}"),
    };
    let tools = tools.map(|t| (t, n.to_string()));
    if c.stream {
        let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let s = sse_stream(st, submitted, kind, id, want_logprobs, include_usage, tools);
        Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response())
    } else {
        let group = vec![(submitted, None)];
        let (choices, usage, timings) =
            collect_groups(&st, kind, group, want_logprobs, samples, tools.as_ref()).await?;
        Ok(Json(body(&st, kind, &id, choices, usage, timings)).into_response())
    }
}

/// A chat's message and finish reason: the calls found in `text` (when tools are read)
/// as `tool_calls`, the text before them as content (null when none).
fn chat_message(
    text: String,
    finish: &str,
    tools: Option<&(ToolOutput, String)>,
    reasoning: Option<ReasoningParser>,
) -> (Value, String) {
    let Some(parser) = reasoning else {
        return chat_content(text, finish, tools);
    };
    // The thinking part first: calls are read from the content after it.
    let (thinking, content) = parser.split(&text);
    let (mut message, finish) = chat_content(content, finish, tools);
    message["reasoning_content"] = thinking.map_or(Value::Null, Value::from);
    (message, finish)
}

/// [`chat_message`] without a thinking part.
fn chat_content(
    text: String,
    finish: &str,
    tools: Option<&(ToolOutput, String)>,
) -> (Value, String) {
    if let Some((t, call_id)) = tools {
        if let Some((before, calls)) = t.format.parse(&text) {
            let content = if before.is_empty() {
                Value::Null
            } else {
                Value::from(before)
            };
            let finish = if finish == "stop" {
                "tool_calls"
            } else {
                finish
            };
            let message = json!({
                "role": "assistant",
                "content": content,
                "tool_calls": super::tools::calls_json(&calls, call_id),
            });
            return (message, finish.to_string());
        }
    }
    (
        json!({"role": "assistant", "content": text}),
        finish.to_string(),
    )
}

/// One token's logprob entry in the endpoint's format.
pub(super) fn logprob_entry(
    st: &AppState,
    kind: Kind,
    id: u32,
    lp: f32,
    top: &[(u32, f32)],
) -> Value {
    let piece = |t: u32| {
        st.engine
            .tokenizer
            .as_ref()
            .and_then(|tk| tk.decode(&[t], false).ok())
            .unwrap_or_default()
    };
    match kind {
        Kind::Chat => {
            let entry = |t: u32, l: f32| {
                let p = piece(t);
                json!({"token": p, "logprob": l, "bytes": p.as_bytes()})
            };
            let mut v = entry(id, lp);
            v["top_logprobs"] = Value::Array(top.iter().map(|&(t, l)| entry(t, l)).collect());
            v
        }
        Kind::Completion => {
            let tops: serde_json::Map<String, Value> =
                top.iter().map(|&(t, l)| (piece(t), json!(l))).collect();
            json!({"token": piece(id), "logprob": lp, "top": tops})
        }
    }
}

/// Folds per-token entries into the completions `logprobs` object.
fn completion_logprobs(entries: &[Value], start_offset: usize) -> Value {
    let mut offset = start_offset;
    let mut offsets = Vec::new();
    for e in entries {
        offsets.push(offset);
        offset += e["token"].as_str().map_or(0, str::len);
    }
    json!({
        "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| e["top"].clone()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn timings_json(t: &RequestTimings) -> Value {
    json!({
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_second": t.prompt_per_second,
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_second": t.predicted_per_second,
        "cached_n": t.cached_n,
    })
}

/// One finished choice: its JSON (at `index`), usage, timings, and the sum of its tokens'
/// logprobs (for `best_of`; 0 when they were not asked for).
struct Choice {
    json: Value,
    usage: Usage,
    timings: RequestTimings,
    cumulative_logprob: f64,
}

/// Reads one request's updates to its end and builds its choice.
#[allow(clippy::too_many_arguments)]
async fn collect_choice(
    st: &AppState,
    mut rx: UnboundedReceiver<Update>,
    mut guard: RequestGuard,
    kind: Kind,
    index: usize,
    want_logprobs: bool,
    echo: Option<Echo>,
    tools: Option<&(ToolOutput, String)>,
) -> Result<Choice, ApiError> {
    let mut text = String::new();
    let mut entries = Vec::new();
    let mut prompt_scores = Vec::new();
    let mut cumulative_logprob = 0.0f64;
    while let Some(update) = rx.recv().await {
        match update {
            Update::PromptLogprobs { scores, .. } => prompt_scores.extend(scores),
            Update::Token {
                id: tok,
                text: piece,
                logprob,
                top_logprobs,
            } => {
                text.push_str(&piece);
                cumulative_logprob += f64::from(logprob.unwrap_or(0.0));
                if want_logprobs {
                    entries.push(logprob_entry(
                        st,
                        kind,
                        tok,
                        logprob.unwrap_or(f32::NAN),
                        &top_logprobs,
                    ));
                }
            }
            Update::Finished {
                reason,
                text: rest,
                error,
                usage,
                timings,
            } => {
                guard.finished();
                if let Some(e) = super::error::for_finish(reason, error) {
                    return Err(e);
                }
                text.push_str(&rest);
                if let Some(echo) = &echo {
                    text.insert_str(0, &echo.text);
                    if want_logprobs {
                        let mut all = super::echo::prompt_entries(st, echo, &prompt_scores)?;
                        all.append(&mut entries);
                        entries = all;
                    }
                }
                let finish = if reason == "cancelled" {
                    "abort"
                } else {
                    reason
                };
                let logprobs = match (want_logprobs, kind) {
                    (false, _) => Value::Null,
                    (true, Kind::Completion) => completion_logprobs(&entries, 0),
                    (true, Kind::Chat) => json!({"content": entries}),
                };
                let json = match kind {
                    Kind::Completion => {
                        json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
                    }
                    Kind::Chat => {
                        let (message, finish) = chat_message(text, finish, tools, st.reasoning);
                        json!({
                            "index": index,
                            "message": message,
                            "logprobs": logprobs,
                            "finish_reason": finish,
                        })
                    }
                };
                return Ok(Choice {
                    json,
                    usage,
                    timings,
                    cumulative_logprob,
                });
            }
        }
    }
    Err(ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine stopped before the request finished",
    ))
}

/// The response body around finished choices.
fn body(
    st: &AppState,
    kind: Kind,
    id: &str,
    choices: Vec<Value>,
    usage: Usage,
    timings: Option<RequestTimings>,
) -> Value {
    let mut body = json!({
        "id": id,
        "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": now_secs(),
        "model": st.model_name,
        "choices": choices,
        "usage": usage_json(&usage),
    });
    if let (true, Some(t)) = (st.timings, timings) {
        body["timings"] = timings_json(&t);
    }
    body
}

/// Reads every prompt's samples to their ends and returns the choices in order (prompt
/// `p`'s `j`-th choice at index `p * n + j`; with `best_of`, the `n` samples with the
/// highest cumulative logprob, highest first), the usage (each prompt counted once, every
/// generated token counted, those of samples left out too), and the timings when there
/// is one sample.
async fn collect_groups(
    st: &AppState,
    kind: Kind,
    groups: Vec<(Vec<Submitted>, Option<Echo>)>,
    want_logprobs: bool,
    samples: Samples,
    tools: Option<&(ToolOutput, String)>,
) -> Result<(Vec<Value>, Usage, Option<RequestTimings>), ApiError> {
    let collected =
        futures_util::future::try_join_all(groups.into_iter().map(|(submitted, echo)| {
            let many = submitted.len() > 1;
            futures_util::future::try_join_all(submitted.into_iter().enumerate().map(
                move |(j, (guard, rx))| {
                    // Each sample's calls get ids of their own.
                    let tools = tools.map(|(t, id)| {
                        let id = if many {
                            format!("{id}_{j}")
                        } else {
                            id.clone()
                        };
                        (t.clone(), id)
                    });
                    let echo = echo.clone();
                    async move {
                        let tools = tools.as_ref();
                        collect_choice(st, rx, guard, kind, 0, want_logprobs, echo, tools).await
                    }
                },
            ))
        }))
        .await?;
    let single = collected.len() == 1 && collected[0].len() == 1;
    let timings = single.then(|| collected[0][0].timings);
    let mut usage = Usage::default();
    let mut choices = Vec::new();
    for (p, mut group) in collected.into_iter().enumerate() {
        if let Some(first) = group.first() {
            usage.prompt_tokens += first.usage.prompt_tokens;
            usage.cached_tokens += first.usage.cached_tokens;
        }
        usage.completion_tokens += group
            .iter()
            .map(|c| c.usage.completion_tokens)
            .sum::<usize>();
        if samples.ranks() {
            // Stable: equal sums keep the samples' order.
            group.sort_by(|a, b| b.cumulative_logprob.total_cmp(&a.cumulative_logprob));
            group.truncate(samples.n);
        }
        for (j, mut c) in group.into_iter().enumerate() {
            c.json["index"] = json!(p * samples.n + j);
            choices.push(c.json);
        }
    }
    Ok((choices, usage, timings))
}

/// Several prompts in one completions request (or any with `echo`): each sample runs as
/// its own request in the engine (batched with everything else), and the choices come
/// back in prompt order, each led by its prompt where `echoes` has it.
async fn collect_many(
    st: Shared,
    gens: Vec<GenerationRequest>,
    echoes: Vec<Option<Echo>>,
    want_logprobs: bool,
    samples: Samples,
) -> Result<Response, ApiError> {
    // Submitted together, so that they share steps; a refusal drops the guards taken so
    // far, which cancels those requests.
    let mut groups = Vec::with_capacity(gens.len());
    for (gen, echo) in gens.into_iter().zip(echoes) {
        groups.push((
            samples::submit_samples(&st.engine, samples.expand(gen))?,
            echo,
        ));
    }
    let id = format!("cmpl-{}", st.next_id.fetch_add(1, Ordering::Relaxed));
    let (choices, usage, timings) =
        collect_groups(&st, Kind::Completion, groups, want_logprobs, samples, None).await?;
    Ok(Json(body(&st, Kind::Completion, &id, choices, usage, timings)).into_response())
}

/// One sample's updates, tagged with its choice index.
type Tagged = std::pin::Pin<Box<dyn Stream<Item = (usize, Update)> + Send>>;

struct StreamState {
    st: Shared,
    /// Every sample's updates, merged as they come.
    updates: stream::SelectAll<Tagged>,
    /// One per sample: dropping the stream (client gone) drops them, cancelling all.
    guards: Vec<RequestGuard>,
    kind: Kind,
    id: String,
    want_logprobs: bool,
    include_usage: bool,
    created: u64,
    /// Per choice: whether its role chunk went out (chat), and its text offset.
    sent_role: Vec<bool>,
    text_offset: Vec<usize>,
    /// Choices finished so far, and their usage (the prompt counted once).
    finished: usize,
    usage: Usage,
    /// Events still to send before reading the next update.
    queue: std::collections::VecDeque<Event>,
    done: bool,
    /// The tool-call format and call-id prefix, when calls are read from the output.
    tools: Option<(ToolOutput, String)>,
    /// Per choice, text held back because it may be (the start of) a call.
    held: Vec<String>,
    /// Per choice, its thinking split off (chat, with `--reasoning-parser`).
    thinking: Vec<Option<Splitter>>,
}

impl StreamState {
    fn chunk(
        &self,
        index: usize,
        delta_text: &str,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Completion => {
                json!({"index": index, "text": delta_text, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Chat => {
                let delta = if finish.is_some() && delta_text.is_empty() {
                    json!({})
                } else {
                    json!({"content": delta_text})
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.st.model_name,
            "choices": [choice],
        })
    }

    fn data(v: &Value) -> Event {
        Event::default().data(v.to_string())
    }

    /// At the end of choice `index`'s stream when tool calls are read: its held text with
    /// the rest, parsed. Calls go out as OpenAI sends them (per call: its index, id, type
    /// and name, then its arguments), after any text before them; returns the text left for
    /// the last chunk and the finish reason.
    fn tool_call_chunks<'a>(
        &mut self,
        index: usize,
        rest: String,
        finish: &'a str,
    ) -> (String, &'a str) {
        let Some((t, call_id)) = self.tools.clone() else {
            return (rest, finish);
        };
        // Each sample's calls get ids of their own.
        let call_id = if self.guards.len() > 1 {
            format!("{call_id}_{index}")
        } else {
            call_id
        };
        let text = std::mem::take(&mut self.held[index]) + &rest;
        let Some((before, calls)) = t.format.parse(&text) else {
            return (text, finish);
        };
        if !before.is_empty() {
            let c = self.chunk(index, &before, Value::Null, None);
            self.queue.push_back(Self::data(&c));
        }
        for (i, call) in super::tools::calls_json(&calls, &call_id)
            .into_iter()
            .enumerate()
        {
            let head = json!({"index": i, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}});
            let args =
                json!({"index": i, "function": {"arguments": call["function"]["arguments"]}});
            for part in [head, args] {
                let mut c = self.chunk(index, "", Value::Null, None);
                c["choices"][0]["delta"] = json!({"tool_calls": [part]});
                self.queue.push_back(Self::data(&c));
            }
        }
        let finish = if finish == "stop" {
            "tool_calls"
        } else {
            finish
        };
        (String::new(), finish)
    }

    /// Choice `index`'s next text with its thinking sent on as `reasoning_content`
    /// deltas; returns the content part (all of it without `--reasoning-parser`). With
    /// `end`, releases what the split held back.
    fn split_thinking(&mut self, index: usize, text: String, end: bool) -> String {
        let Some(s) = self.thinking[index].as_mut() else {
            return text;
        };
        let (mut thinking, mut content) = s.push(&text);
        if end {
            let (t, c) = s.finish();
            thinking += &t;
            content += &c;
        }
        if !thinking.is_empty() {
            let mut c = self.chunk(index, "", Value::Null, None);
            c["choices"][0]["delta"] = json!({"reasoning_content": thinking});
            self.queue.push_back(Self::data(&c));
        }
        content
    }

    fn handle(&mut self, index: usize, update: Update) {
        if self.kind == Kind::Chat && !self.sent_role[index] {
            self.sent_role[index] = true;
            let mut first = self.chunk(index, "", Value::Null, None);
            first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
            self.queue.push_back(Self::data(&first));
        }
        match update {
            // Prompt logprobs come only with `echo`, which is not streamed.
            Update::PromptLogprobs { .. } => {}
            Update::Token {
                id,
                text,
                logprob,
                top_logprobs,
            } => {
                let logprobs = if self.want_logprobs {
                    let e = logprob_entry(
                        &self.st,
                        self.kind,
                        id,
                        logprob.unwrap_or(f32::NAN),
                        &top_logprobs,
                    );
                    match self.kind {
                        Kind::Completion => completion_logprobs(&[e], self.text_offset[index]),
                        Kind::Chat => json!({"content": [e]}),
                    }
                } else {
                    Value::Null
                };
                self.text_offset[index] += text.len();
                let text = self.split_thinking(index, text, false);
                let text = match &self.tools {
                    Some((t, _)) => {
                        let held = &mut self.held[index];
                        held.push_str(&text);
                        let plain = t.format.plain_prefix(held);
                        held.drain(..plain).collect()
                    }
                    None => text,
                };
                // A model without a tokenizer has no text to stream: one (empty) chunk per
                // token still tells the client a token was generated.
                let no_text = self.st.engine.tokenizer.is_none();
                if !text.is_empty() || self.want_logprobs || no_text {
                    let c = self.chunk(index, &text, logprobs, None);
                    self.queue.push_back(Self::data(&c));
                }
            }
            Update::Finished {
                reason,
                text,
                error,
                usage,
                timings,
            } => {
                self.guards[index].finished();
                self.finished += 1;
                if let Some(e) = super::error::for_finish(reason, error) {
                    // The stream ends here; dropping it cancels the other samples.
                    self.queue.push_back(Self::data(&e.event_json()));
                    self.queue.push_back(Event::default().data("[DONE]"));
                    self.done = true;
                    return;
                }
                let finish = if reason == "cancelled" {
                    "abort"
                } else {
                    reason
                };
                let text = self.split_thinking(index, text, true);
                let (text, finish) = self.tool_call_chunks(index, text, finish);
                let mut c = self.chunk(index, &text, Value::Null, Some(finish));
                if self.st.timings {
                    c["timings"] = timings_json(&timings);
                }
                self.queue.push_back(Self::data(&c));
                if index == 0 {
                    self.usage.prompt_tokens = usage.prompt_tokens;
                    self.usage.cached_tokens = usage.cached_tokens;
                }
                self.usage.completion_tokens += usage.completion_tokens;
                if self.finished < self.guards.len() {
                    return;
                }
                self.done = true;
                if self.include_usage {
                    let mut u = self.chunk(0, "", Value::Null, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&self.usage);
                    self.queue.push_back(Self::data(&u));
                }
                self.queue.push_back(Event::default().data("[DONE]"));
            }
        }
    }
}

/// Streams the samples of one prompt, each chunk carrying its choice's index; `[DONE]`
/// follows the last choice's end. With `tools`, calls in a chat's output become
/// `tool_calls` deltas.
fn sse_stream(
    st: Shared,
    submitted: Vec<Submitted>,
    kind: Kind,
    id: String,
    want_logprobs: bool,
    include_usage: bool,
    tools: Option<(ToolOutput, String)>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let count = submitted.len();
    let mut guards = Vec::with_capacity(count);
    let mut updates = stream::SelectAll::new();
    for (index, (guard, rx)) in submitted.into_iter().enumerate() {
        guards.push(guard);
        let tagged = stream::unfold(rx, move |mut rx| async move {
            let update = rx.recv().await?;
            Some(((index, update), rx))
        });
        updates.push(Box::pin(tagged) as Tagged);
    }
    let thinking = st
        .reasoning
        .filter(|_| kind == Kind::Chat)
        .map(Splitter::new);
    let state = StreamState {
        st,
        updates,
        guards,
        kind,
        id,
        want_logprobs,
        include_usage,
        created: now_secs(),
        sent_role: vec![false; count],
        text_offset: vec![0; count],
        finished: 0,
        usage: Usage::default(),
        queue: Default::default(),
        done: false,
        tools,
        held: vec![String::new(); count],
        thinking: vec![thinking; count],
    };
    // Dropping the stream (client gone) drops the guards, which cancels the samples.
    stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            match s.updates.next().await {
                Some((index, update)) => s.handle(index, update),
                // The engine thread ended without finishing every sample: say so, rather
                // than end the stream as if it had.
                None => {
                    s.done = true;
                    let e = json!({"error": {
                        "message": "the engine stopped before the request finished",
                        "type": "server_error",
                        "code": 500,
                    }});
                    s.queue.push_back(StreamState::data(&e));
                }
            }
        }
    })
}
