//! The OpenAI-compatible routes in process, with no socket: the router `strata serve` puts
//! behind its listener, built over an engine running the tiny random Llama of
//! `tests/fixtures/tiny/llama-tiny`, and one `POST /v1/completions` of token ids sent through
//! `tower::ServiceExt::oneshot`. The fixture has no tokenizer, so prompts are token ids.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request};
use strata_engine::{Device, Engine, EngineOptions, LoadedModel};
use strata_server::serve::{router, AppState, HttpOptions};
use tower::ServiceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama-tiny");
    let loaded = LoadedModel::load(&dir, Device::Cpu)?;
    let opts = EngineOptions {
        kv_budget_bytes: 8 << 20,
        ..Default::default()
    };
    let engine = Engine::start(loaded, "tiny".into(), opts)?;
    let state = Arc::new(AppState::new(engine, "tiny".into()));
    let http = HttpOptions {
        body_timeout: Duration::from_secs(10),
        allowed_origins: Vec::new(),
        ui: true,
    };
    let app = router(state, &http)?;

    let body = serde_json::json!({
        "model": "tiny", "prompt": [1, 5, 9, 13], "max_tokens": 4, "temperature": 0
    });
    let request = Request::post("/v1/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))?;
    let response = app.oneshot(request).await?;
    println!("{}", response.status());
    let bytes = to_bytes(response.into_body(), 1 << 20).await?;
    let answer: serde_json::Value = serde_json::from_slice(&bytes)?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}
