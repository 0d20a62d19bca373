//! `strata inspect`: what the engine will make of a model, without loading its weights.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use strata_config::{load_model_config, ModelConfig};

#[derive(Args)]
pub struct InspectArgs {
    /// A `config.json`, a model directory, or a `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let (config, _source) = load_model_config(&args.model)
        .with_context(|| format!("cannot serve {}", args.model.display()))?;
    let report = report(&config);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&config));
    }
    Ok(())
}

/// The JSON report. Keys are stable: later additions extend it, never rename.
fn report(c: &ModelConfig) -> Value {
    let groups: Vec<Value> = c
        .kv_group_specs()
        .iter()
        .map(|g| {
            json!({
                "attention": g.attention.short_name(),
                "window": g.window,
                "layer_ids": g.layer_ids,
                "shared_layers": g.shared_layers,
            })
        })
        .collect();
    json!({
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
    })
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

fn human(c: &ModelConfig) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "architecture      {}", c.architecture.name());
    let _ = writeln!(s, "layers            {}", c.num_layers());
    let _ = writeln!(s, "hidden / vocab    {} / {}", c.hidden_size, c.vocab_size);
    let types: String = c
        .layers
        .iter()
        .map(|l| {
            if l.kv_source.is_some() {
                l.attention.short_name()[..1].to_string()
            } else {
                l.attention.short_name()[..1].to_uppercase()
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
    let _ = writeln!(
        s,
        "kv_shared_layers  {}",
        if pairs.is_empty() {
            "none".into()
        } else {
            pairs.join(" ")
        }
    );
    for g in c.kv_group_specs() {
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
    }
    s
}
