//! `GET /v1/kv/layout`: the KV pool's layout, per layer, as `strata inspect` reports it.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use strata_kv::KvLayout;

use super::routes::Shared;

/// The layout of the served model's KV pool.
pub async fn kv_layout(State(st): State<Shared>) -> Json<Value> {
    Json(layout_json(&st.engine.kv_layout))
}

/// Per layer: its attention kind, the pool it uses, whether it owns KV or reads another
/// layer's (`kv_source`); per group and in total: bytes per token with and without sharing.
fn layout_json(layout: &KvLayout) -> Value {
    let layers: Vec<Value> = layout
        .layers_mapping()
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let attention = layout
                .group(l.pool)
                .map_or("unknown", |g| g.attention.short_name());
            json!({
                "layer": i,
                "attention": attention,
                "pool": l.pool.name(),
                "owns_kv": !l.shared,
                "kv_source": l.source_layer,
            })
        })
        .collect();
    let groups: Vec<Value> = layout
        .groups()
        .iter()
        .map(|g| {
            json!({
                "pool": g.pool.name(),
                "attention": g.attention.short_name(),
                "window": g.window,
                "owner_layers": g.owner_layers,
                "shared_layers": g.shared_layers,
                "unit_bytes": g.unit_bytes,
                "unit_bytes_unshared": g.unit_bytes_unshared,
            })
        })
        .collect();
    json!({
        "num_layers": layers.len(),
        "kv_cache_dtype": layout.format().cache_dtype().name(),
        "layers": layers,
        "groups": groups,
        "kv_cost": layout.kv_cost(),
        "kv_cost_unshared": layout.kv_cost_unshared(),
    })
}
