//! `strata inspect`: what the engine will make of a model: layer layout, KV sharing, KV
//! groups and their byte prices, pages for a budget, and (when weights are present) the
//! tensors. Weights are read only as far as their headers.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use strata_config::{load_model_config, ModelConfig, ModelSource};
use strata_kv::{KvCacheDtype, KvLayout, PagePlan, DEFAULT_WINDOW_RATIO};

/// `strata inspect`'s flags.
#[derive(Args)]
pub struct InspectArgs {
    /// A `config.json`, a model directory, or a `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// KV format to price: auto, bf16, f16, f32, fp8_per_token_head, int8_per_token_head.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Report the pages this many bytes of KV memory hold.
    #[arg(long)]
    pub kv_budget_bytes: Option<u64>,
    /// Tokens per page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Sliding-window pool size as a fraction of the full pool's pages.
    #[arg(long, default_value_t = DEFAULT_WINDOW_RATIO)]
    pub swa_ratio: f64,
    /// Also decode every stored weight and fail if one is NaN or infinite.
    #[arg(long)]
    pub check_weights: bool,
    /// With --model ORG/NAME (a Hugging Face repo id): the branch, tag or commit.
    #[arg(long)]
    pub revision: Option<String>,
}

/// Runs `strata inspect`: prints what the engine makes of the model.
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let model = crate::hub::resolve(&args.model, args.revision.as_deref())?;
    let (config, source) =
        load_model_config(&model).with_context(|| format!("cannot serve {}", model.display()))?;
    let dtype = args.kv_cache_dtype;
    let layout = KvLayout::for_config(&config, dtype).context("laying out the KV pool")?;
    let pages = match args.kv_budget_bytes {
        Some(budget) => Some(
            layout
                .plan_pages(budget, args.page_size, args.swa_ratio)
                .context("planning pages for --kv-budget-bytes")?,
        ),
        None => None,
    };
    let weights = weights_summary(&source)?;
    if args.check_weights {
        crate::placement::check_weights(&model)?;
    }
    if args.json {
        let report = report(&config, &layout, pages.as_ref(), weights.as_ref());
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!(
            "{}",
            human(&config, &layout, pages.as_ref(), weights.as_ref())
        );
    }
    Ok(())
}

/// Where the model's weights are, when they are there to read.
pub fn weights_path(source: &ModelSource) -> Option<PathBuf> {
    match source {
        ModelSource::Gguf(p) => Some(p.clone()),
        ModelSource::HuggingFace { dir, .. } => {
            let has_weights = dir.join("model.safetensors").is_file()
                || dir.join("model.safetensors.index.json").is_file();
            has_weights.then(|| dir.clone())
        }
    }
}

/// Tensor counts, when the model's weights are there to read.
fn weights_summary(source: &ModelSource) -> anyhow::Result<Option<strata_weights::WeightsSummary>> {
    let Some(path) = weights_path(source) else {
        return Ok(None);
    };
    let summary = strata_weights::inspect(&path)
        .with_context(|| format!("reading the tensors of {}", path.display()))?;
    Ok(Some(summary))
}

/// The JSON report. Keys are stable: later additions extend it, never rename.
fn report(
    c: &ModelConfig,
    layout: &KvLayout,
    pages: Option<&PagePlan>,
    weights: Option<&strata_weights::WeightsSummary>,
) -> Value {
    let groups: Vec<Value> = c
        .kv_group_specs()
        .iter()
        .zip(layout.groups())
        .map(|(g, l)| {
            json!({
                "attention": g.attention.short_name(),
                "window": g.window,
                "layer_ids": g.layer_ids,
                "shared_layers": g.shared_layers,
                "unit_bytes": l.unit_bytes,
                "unit_bytes_unshared": l.unit_bytes_unshared,
            })
        })
        .collect();
    let mut v = json!({
        "architecture": c.architecture.name(),
        "num_layers": c.num_layers(),
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "num_attention_heads": c.num_attention_heads,
        "layer_types": c.layers.iter().map(|l| l.attention.hf_name()).collect::<Vec<_>>(),
        "head_dims": c.layers.iter().map(|l| l.head_dim).collect::<Vec<_>>(),
        "num_kv_heads": c.layers.iter().map(|l| l.num_kv_heads).collect::<Vec<_>>(),
        "intermediate_sizes": c.layers.iter().map(|l| l.intermediate_size).collect::<Vec<_>>(),
        "kv_shared_layers": c.kv_shared_layers(),
        "kv_groups": groups,
        "kv_cache_dtype": layout.format().cache_dtype().name(),
        "kv_cost": layout.kv_cost(),
        "kv_cost_unshared": layout.kv_cost_unshared(),
    });
    if let Some(p) = pages {
        v["pages"] = json!({ "full": p.full, "window": p.window, "page_size": p.page_size });
        if let Some((share, per_request)) = window_share(layout, p) {
            v["pages"]["window_share_of_bytes"] = json!(share);
            v["pages"]["window_pages_per_request"] = json!(per_request);
        }
    }
    if let Some(w) = weights {
        v["tensors"] = json!(w.tensor_count);
        v["tensor_types"] = json!(w.types);
        v["parameters"] = json!(w.parameters);
    }
    v
}

/// The window pool's share of the KV bytes and the pages one running request's window
/// holds at most (`None` for a model without sliding-window layers).
fn window_share(layout: &KvLayout, p: &PagePlan) -> Option<(f64, usize)> {
    let window = layout.groups().iter().find_map(|g| g.window)?;
    let bytes = |windowed: bool| -> usize {
        layout
            .groups()
            .iter()
            .filter(|g| g.window.is_some() == windowed)
            .map(|g| g.unit_bytes)
            .sum()
    };
    let (full, win) = (
        p.full * p.page_size * bytes(false),
        p.window * p.page_size * bytes(true),
    );
    // A window of W positions spans at most W / page + 1 pages (a partial page at each end).
    let per_request = window.div_ceil(p.page_size) + 1;
    Some((win as f64 / (full + win).max(1) as f64, per_request))
}

fn ranges(ids: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

fn human(
    c: &ModelConfig,
    layout: &KvLayout,
    pages: Option<&PagePlan>,
    weights: Option<&strata_weights::WeightsSummary>,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "architecture      {}", c.architecture.name());
    let _ = writeln!(s, "layers            {}", c.num_layers());
    let _ = writeln!(s, "hidden / vocab    {} / {}", c.hidden_size, c.vocab_size);
    let types: String = c
        .layers
        .iter()
        .map(|l| {
            let letter = &l.attention.short_name()[..1];
            if l.kv_source.is_some() {
                letter.to_string()
            } else {
                letter.to_uppercase()
            }
        })
        .collect();
    let _ = writeln!(
        s,
        "layer types       {types}  (F full, S sliding; lower case = KV-shared)"
    );
    let pairs: Vec<String> = c
        .kv_shared_layers()
        .iter()
        .map(|(l, s)| format!("{l}<-{s}"))
        .collect();
    let shared = if pairs.is_empty() {
        "none".into()
    } else {
        pairs.join(" ")
    };
    let _ = writeln!(s, "kv_shared_layers  {shared}");
    let _ = writeln!(
        s,
        "kv cache dtype    {}",
        layout.format().cache_dtype().name()
    );
    for (g, l) in c.kv_group_specs().iter().zip(layout.groups()) {
        let window = g.window.map_or(String::new(), |w| format!(" window {w}"));
        let _ = writeln!(s, "kv group {}{window}", g.attention.short_name());
        let _ = writeln!(
            s,
            "  owns KV         {} ({} layers)",
            ranges(&g.layer_ids),
            g.layer_ids.len()
        );
        let _ = writeln!(
            s,
            "  reads shared KV {} ({} layers)",
            ranges(&g.shared_layers),
            g.shared_layers.len()
        );
        let _ = writeln!(
            s,
            "  bytes per token {} (every layer its own copy: {})",
            l.unit_bytes, l.unit_bytes_unshared
        );
    }
    if let Some(p) = pages {
        let _ = writeln!(
            s,
            "pages             full {} + window {} of {} tokens",
            p.full, p.window, p.page_size
        );
        if let Some((share, per_request)) = window_share(layout, p) {
            let _ = writeln!(
                s,
                "window pool       {:.0}% of the KV bytes: up to {per_request} pages per running \
                 request's window ({} requests fill it); pages no running request reads keep \
                 cached prefixes' window K/V, evicted least recently used first",
                100.0 * share,
                p.window / per_request
            );
        }
    }
    if let Some(w) = weights {
        let types: Vec<String> = w.types.iter().map(|(t, n)| format!("{t} {n}")).collect();
        let _ = writeln!(
            s,
            "tensors           {} ({})",
            w.tensor_count,
            types.join(", ")
        );
        let _ = writeln!(s, "parameters        {}", w.parameters);
    }
    s
}
