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
    app_over("llama-tiny", admin_key, true)
}

/// The routes over fixture `model`, with the page at `/` when `ui`.
fn app_over(model: &str, admin_key: Option<&str>, ui: bool) -> Router {
    let loaded = LoadedModel::load(&fixture(model), Device::Cpu).expect("fixture loads");
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
        ui,
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

/// The page and its files are served with `--ui on`, under a policy that runs only the
/// server's own scripts; with `--ui off` `/` is not found.
#[tokio::test]
async fn the_page_is_served_only_with_ui_on() {
    let on = app_over("llama-tiny", None, true);
    for (path, kind) in [
        ("/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        let resp = on.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers();
        assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind));
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        let body = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        assert!(!body.is_empty(), "{path}");
    }
    let off = app_over("llama-tiny", None, false);
    for path in ["/", "/ui/app.js"] {
        let (status, v) = call(&off, "GET", path, None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    // The API is the same either way.
    let (status, _) = call(&off, "GET", "/v1/kv/layout", None, None).await;
    assert_eq!(status, StatusCode::OK);
}

/// `/v1/kv/layout` on the tiny Gemma-4 against the rule transformers applies, computed here
/// from its config.json: the last `num_kv_shared_layers` layers read the KV of the last
/// earlier layer of their attention type, and only owning layers cost bytes.
#[tokio::test]
async fn the_kv_layout_follows_the_config() {
    let config: Value =
        serde_json::from_slice(&std::fs::read(fixture("gemma4-tiny").join("config.json")).unwrap())
            .unwrap();
    let types: Vec<&str> = config["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().trim_end_matches("_attention"))
        .collect();
    let first_shared = types.len() - config["num_kv_shared_layers"].as_u64().unwrap() as usize;
    let head_dim = |i: usize| {
        config["per_layer_config"][i.to_string()]["head_dim"]
            .as_u64()
            .unwrap_or(config["head_dim"].as_u64().unwrap())
    };
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap();

    let app = app_over("gemma4-tiny", None, true);
    let (status, v) = call(&app, "GET", "/v1/kv/layout", None, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let elem_bytes = match v["kv_cache_dtype"].as_str().unwrap() {
        "f32" => 4,
        "bf16" | "f16" => 2,
        other => panic!("unexpected KV dtype {other}"),
    };
    assert_eq!(v["num_layers"], types.len());
    let (mut owned, mut all) = (0, 0);
    for (i, kind) in types.iter().enumerate() {
        let source = if i < first_shared {
            i
        } else {
            (0..first_shared)
                .rev()
                .find(|&j| types[j] == *kind)
                .unwrap()
        };
        let layer = &v["layers"][i];
        assert_eq!(layer["layer"], i);
        assert_eq!(layer["attention"], *kind, "layer {i}");
        assert_eq!(layer["owns_kv"], source == i, "layer {i}");
        assert_eq!(layer["kv_source"], source, "layer {i}");
        let bytes = 2 * kv_heads * head_dim(i) * elem_bytes;
        all += bytes;
        if source == i {
            owned += bytes;
        }
    }
    assert_eq!(v["kv_cost"], owned);
    assert_eq!(v["kv_cost_unshared"], all);
    assert!(owned < all, "the fixture shares KV");
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
        ui: true,
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
