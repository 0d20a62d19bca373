//! `cargo xtask bench --cpu --serving`: the serving level, `strata serve` against
//! `llama-server` through the same client.
//!
//! Each round is one round of `scripts/bench/cpu-serving.sh` (which serves with one engine,
//! then the other, and runs 1 client, 8 clients and one long prompt against each), probed
//! as a whole ([`crate::bench_probe`]): the two servers and the client share the machine,
//! so the probe counts the whole round's own time and marks the round starved when
//! something else took more than the limit. The summary is the median of the clean rounds'
//! ratios.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde_json::{json, Value};

use crate::bench::{median, output, release_build, Opts};
use crate::bench_probe::{cell, starved, Probe};

/// The loads the script runs: (file tag, figure, label). For TTFT the ratio is
/// llama-server's over Strata's, so above 1 is Strata faster for every figure.
const LOADS: [(&str, &str, &str); 3] = [
    ("c1", "output_throughput", "1 client: output tok/s"),
    ("c8", "output_throughput", "8 clients: output tok/s"),
    ("long", "ttft", "long prompt: TTFT, llama-server / Strata"),
];

fn figure(v: &Value, key: &str) -> Option<f64> {
    if key == "ttft" {
        v["ttft_ms"]["mean"].as_f64()
    } else {
        v[key].as_f64()
    }
}

pub(crate) fn run(root: &Path, o: &Opts, peer: &Path, model: &Path) -> anyhow::Result<Value> {
    eprintln!("bench: building strata (release) ...");
    let release = release_build(root, &["-p", "strata-server"])?;
    let mut rounds = Vec::new();
    for round in 1..=o.rounds {
        let dir = root.join(format!("target/bench/serving/round-{round}"));
        std::fs::create_dir_all(&dir)?;
        eprintln!("bench: serving round {round} ...");
        let probe = Probe::start();
        output(
            Command::new("bash")
                .current_dir(root)
                .env("LLAMA_SERVER", peer)
                .env("STRATA", release.join("strata"))
                .env("THREADS", o.threads.to_string())
                .arg("scripts/bench/cpu-serving.sh")
                .arg(&dir)
                .arg(model)
                .arg("1"),
        )?;
        let probe = probe.finish(o.starved);
        let mut loads = json!({});
        for (tag, key, _) in LOADS {
            let read = |engine: &str| -> anyhow::Result<Value> {
                let f = dir.join(format!("{engine}-1-{tag}.json"));
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                Ok(serde_json::from_str(&text)?)
            };
            let (s, l) = (figure(&read("strata")?, key), figure(&read("llama")?, key));
            let ratio = match (s, l) {
                (Some(s), Some(l)) if s > 0.0 && l > 0.0 => {
                    Some(if key == "ttft" { l / s } else { s / l })
                }
                _ => None,
            };
            loads[tag] = json!({"strata": s, "llama_server": l, "ratio": ratio});
        }
        rounds.push(json!({"round": round, "loads": loads, "probe": probe}));
    }
    let summary: Vec<Value> = LOADS
        .iter()
        .map(|&(tag, _, _)| {
            let clean: Vec<f64> = rounds
                .iter()
                .filter(|r| !starved(&r["probe"]))
                .filter_map(|r| r["loads"][tag]["ratio"].as_f64())
                .collect();
            json!({"load": tag, "median_clean_ratio": median(clean.clone()), "clean_rounds": clean.len()})
        })
        .collect();
    Ok(json!({"model": model.display().to_string(), "rounds": rounds, "summary": summary}))
}

pub(crate) fn print_table(serving: &Value) {
    println!();
    println!(
        "Serving ({}), Strata / llama-server:",
        serving["model"].as_str().unwrap_or("")
    );
    println!("| round | load | Strata | llama-server | ratio | others + steal (cores) |");
    println!("|---:|---|---:|---:|---:|---|");
    let f = |v: &Value| v.as_f64().map_or("-".into(), |v| format!("{v:.1}"));
    for r in serving["rounds"].as_array().into_iter().flatten() {
        let cores = cell(&r["probe"]);
        for (tag, _, label) in LOADS {
            let l = &r["loads"][tag];
            println!(
                "| {} | {label} | {} | {} | {} | {cores} |",
                r["round"],
                f(&l["strata"]),
                f(&l["llama_server"]),
                l["ratio"]
                    .as_f64()
                    .map_or("-".into(), |x| format!("{x:.2}")),
            );
        }
    }
    println!();
    println!("| load | median of clean rounds | clean rounds |");
    println!("|---|---:|---:|");
    for (s, (_, _, label)) in serving["summary"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(LOADS)
    {
        println!(
            "| {label} | {} | {} |",
            s["median_clean_ratio"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
            s["clean_rounds"]
        );
    }
}
