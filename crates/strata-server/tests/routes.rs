//! The server's routes in process: the router over a tiny model's engine, with no socket and
//! no child process.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use strata_engine::{Device, Engine, EngineOptions, LoadedModel};
use strata_server::serve::{router, AppState, HttpOptions};
use tower::ServiceExt;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

/// The routes over the tiny Llama (no tokenizer: prompts are token ids).
fn app(admin_key: Option<&str>) -> Router {
    let loaded = LoadedModel::load(&fixture("llama-tiny"), Device::Cpu).expect("fixture loads");
    let opts = EngineOptions {
        kv_budget_bytes: 8 << 20,
        ..Default::default()
    };
    let engine = Engine::start(loaded, "tiny".into(), opts).expect("engine starts");
    let state = AppState {
        admin_api_key: admin_key.map(str::to_string),
        ..AppState::new(engine, "tiny".into())
    };
    let http = HttpOptions {
        body_timeout: Duration::from_secs(10),
        allowed_origins: Vec::new(),
    };
    router(Arc::new(state), &http).expect("router builds")
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = match body {
        Some(b) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn probes_answer() {
    let app = app(None);
    assert_eq!(
        call(&app, "GET", "/health", None, None).await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    assert_eq!(
        call(&app, "GET", "/ready", None, None).await,
        (StatusCode::OK, json!({"status": "ready"}))
    );
}

#[tokio::test]
async fn a_completion_of_token_ids() {
    let app = app(None);
    let body =
        json!({"prompt": [1, 5, 9, 13], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    let (status, v) = call(&app, "POST", "/v1/completions", Some(body), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // Bad input is refused before the engine, naming the field.
    let bad = json!({"prompt": [1, 2], "max_tokens": 4, "temperature": -1});
    let (status, v) = call(&app, "POST", "/v1/completions", Some(bad), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "temperature");
    let other = json!({"model": "other", "prompt": [1], "max_tokens": 1});
    let (status, _) = call(&app, "POST", "/v1/completions", Some(other), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn operator_routes_need_the_admin_key() {
    let off = app(None);
    let (status, _) = call(&off, "POST", "/v1/cache/flush", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let on = app(Some("admin"));
    let (status, _) = call(&on, "POST", "/v1/cache/flush", None, Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, v) = call(&on, "POST", "/v1/cache/flush", None, Some("admin")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["flushed_pages"].is_u64());
}

/// The server cannot go on without its engine thread: when that thread ends unasked (a
/// panic), `/health` answers 503 and the accept loop returns an error, from which the
/// process exits non-zero (a supervisor then restarts it).
#[tokio::test]
async fn the_server_stops_with_an_error_when_its_engine_thread_ends() {
    use strata_server::serve::{listen, serve_on, ConnLimits};
    let loaded = LoadedModel::load(&fixture("llama-tiny"), Device::Cpu).expect("fixture loads");
    let opts = EngineOptions {
        kv_budget_bytes: 8 << 20,
        ..Default::default()
    };
    let engine = Engine::start(loaded, "tiny".into(), opts).expect("engine starts");
    let state = Arc::new(AppState::new(engine.clone(), "tiny".into()));
    let http = HttpOptions {
        body_timeout: Duration::from_secs(10),
        allowed_origins: Vec::new(),
    };
    let app = router(state.clone(), &http).unwrap();
    let (listener, _) = listen(([127, 0, 0, 1], 0).into()).await.unwrap();
    let limits = ConnLimits {
        header_timeout: Duration::from_secs(5),
        max_connections: 8,
        shutdown_timeout: Duration::from_secs(5),
    };
    let serving = tokio::spawn(serve_on(listener, app.clone(), state, limits));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !serving.is_finished(),
        "the server runs while its engine does"
    );
    // The engine thread ends, as it would after a panic, without the server asking.
    engine.shutdown();
    let ended = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the server stops soon after its engine")
        .unwrap();
    let err = ended.expect_err("an engine that ended is an error");
    assert!(err.to_string().contains("engine"), "{err}");
    assert_eq!(
        call(&app, "GET", "/health", None, None).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "engine stopped"})
        )
    );
}
