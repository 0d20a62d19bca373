//! `cargo xtask bench --cpu`: Strata's CPU throughput next to llama.cpp's, measured the same
//! way in the same run, in interleaved rounds.
//!
//! Each round runs, per model, both engines one after the other (Strata first in odd rounds,
//! llama.cpp first in even ones): Strata through the `cpu_bench` example (release build,
//! `RAYON_NUM_THREADS` = the thread count), llama.cpp through `llama-bench` with its
//! defaults (`LLAMA_BENCH=/path/to/llama-bench`; `--peer-file-layout` adds `-fa 0
//! --repack 0`, which keeps its weights in the file's layout as Strata's are). Tests: pp (one
//! prompt of `--pp` pseudo-random ids in one batch), tg (`--tg` greedy steps after one
//! token) and tg at depth (`--tg` steps after a prompt of `--depth` ids, llama-bench's
//! `-d`). Each engine's run is probed ([`crate::bench_probe`]): the load average before it
//! and the CPU time others took during it; a round where either engine was starved is
//! marked and left out of the summary, the median of the clean rounds' ratios.
//!
//! `--serving` (with `LLAMA_SERVER=/path/to/llama-server`) adds the serving level, one round
//! of `scripts/bench/cpu-serving.sh` per round: `strata serve` against `llama-server
//! --parallel 8` through the same client at 1 and 8 clients and with a long prompt.
//!
//! The tables are printed last; everything also goes to `target/bench/cpu.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::bench_probe::Probe;

const DEFAULT_MODELS: [&str; 2] = [
    "models/gemma-3-270m-q4_k_m.gguf",
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
];
const SERVING_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The engine-level tests: (key in the reports, label).
const TESTS: [(&str, &str); 3] = [("pp", "pp"), ("tg", "tg"), ("tgd", "tg@d")];

pub(crate) struct Opts {
    models: Vec<PathBuf>,
    pub(crate) threads: usize,
    pp: usize,
    tg: usize,
    depth: usize,
    reps: usize,
    pub(crate) rounds: usize,
    /// Cores of others' CPU time (and the host's steal) above which a run was starved.
    pub(crate) starved: f64,
    peer_file_layout: bool,
    serving: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        models: vec![],
        threads: 2,
        pp: 512,
        tg: 128,
        depth: 1024,
        reps: 1,
        rounds: 3,
        starved: 0.25,
        peer_file_layout: false,
        serving: false,
    };
    let mut cpu = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .with_context(|| format!("{a} needs a value"))
                .cloned()
        };
        match a.as_str() {
            "--cpu" => cpu = true,
            "--model" => o.models.push(val()?.into()),
            "--threads" => o.threads = val()?.parse()?,
            "--pp" => o.pp = val()?.parse()?,
            "--tg" => o.tg = val()?.parse()?,
            "--depth" => o.depth = val()?.parse()?,
            "--reps" => o.reps = val()?.parse()?,
            "--rounds" => o.rounds = val()?.parse()?,
            "--starved" => o.starved = val()?.parse()?,
            "--peer-file-layout" => o.peer_file_layout = true,
            "--serving" => o.serving = true,
            other => bail!("bench: unknown argument {other}"),
        }
    }
    if !cpu {
        bail!("bench: say --cpu or --gpu (cargo xtask bench --cpu | --gpu)");
    }
    if o.rounds == 0 || o.reps == 0 {
        bail!("bench: --rounds and --reps must be at least 1");
    }
    if o.models.is_empty() {
        o.models = DEFAULT_MODELS.iter().map(PathBuf::from).collect();
    }
    for m in &o.models {
        if !m.exists() {
            bail!(
                "{} is absent (scripts/fetch-models.sh, or pass --model)",
                m.display()
            );
        }
    }
    Ok(o)
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `git rev-parse --short HEAD`, plus " + uncommitted" when the tree has changes.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        output(Command::new("git").current_dir(root).args(args)).unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).trim().to_string();
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])
        .trim()
        .is_empty();
    if dirty {
        format!("{head} + uncommitted")
    } else {
        head
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `cargo build --release --quiet` with `args` in the workspace; returns the release
/// output directory (under `CARGO_TARGET_DIR` when set).
pub(crate) fn release_build(root: &Path, args: &[&str]) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    output(
        Command::new(cargo)
            .current_dir(root)
            .args(["build", "--release", "--quiet"])
            .args(args),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release"))
}

/// The release `cpu_bench` example, built once.
fn build_cpu_bench(root: &Path) -> anyhow::Result<PathBuf> {
    let dir = release_build(root, &["-p", "xtask", "--example", "cpu_bench"])?;
    Ok(dir.join("examples/cpu_bench"))
}

fn strata(bin: &Path, o: &Opts, model: &Path) -> anyhow::Result<Value> {
    let probe = Probe::start();
    let text = output(
        Command::new(bin)
            .env("RAYON_NUM_THREADS", o.threads.to_string())
            .arg("--model")
            .arg(model)
            .args(["--pp", &o.pp.to_string()])
            .args(["--tg", &o.tg.to_string()])
            .args(["--depth", &o.depth.to_string()])
            .args(["--reps", &o.reps.to_string()]),
    )?;
    let line = text.lines().last().context("cpu_bench printed nothing")?;
    let mut r: Value = serde_json::from_str(line)?;
    r["probe"] = probe.finish(o.starved);
    Ok(r)
}

/// llama-bench's arguments for one model: its defaults, plus the file's layout if asked.
fn llama_args(bin: &Path, o: &Opts, model: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec!["-m".into(), model.display().to_string()];
    args.extend(["-t".into(), o.threads.to_string()]);
    args.extend(["-r".into(), o.reps.to_string()]);
    if o.peer_file_layout {
        let help = Command::new(bin)
            .arg("--help")
            .output()
            .map(|h| {
                String::from_utf8_lossy(&h.stdout).into_owned()
                    + &String::from_utf8_lossy(&h.stderr)
            })
            .unwrap_or_default();
        args.extend(["-fa".into(), "0".into()]);
        if help.contains("--no-repack") {
            args.push("--no-repack".into());
        } else if help.contains("--repack") {
            args.extend(["--repack".into(), "0".into()]);
        }
    }
    args.extend(["-o".into(), "json".into()]);
    args
}

/// llama-bench's pp and tg (one invocation), then tg at depth (another, so that no prompt
/// test runs at depth), as tokens/s mean and sd under the keys `cpu_bench` uses.
fn llama(bin: &Path, o: &Opts, model: &Path) -> anyhow::Result<Value> {
    let base = llama_args(bin, o, model);
    let probe = Probe::start();
    let mut r = json!({ "args": base });
    let mut invoke = |tests: &[String], depth_key: bool| -> anyhow::Result<()> {
        let text = output(Command::new(bin).args(&base).args(tests))?;
        let runs: Vec<Value> = serde_json::from_str(&text).context("llama-bench JSON")?;
        for run in runs {
            let key = match (run["n_gen"].as_u64().unwrap_or(0) > 0, depth_key) {
                (true, true) => "tgd",
                (true, false) => "tg",
                (false, _) => "pp",
            };
            r[format!("{key}_tps")] = run["avg_ts"].clone();
            r[format!("{key}_sd")] = run["stddev_ts"].clone();
            r["build_commit"] = run["build_commit"].clone();
        }
        Ok(())
    };
    let s = |v: usize| v.to_string();
    invoke(&["-p".into(), s(o.pp), "-n".into(), s(o.tg)], false)?;
    if o.depth > 0 && o.tg > 0 {
        let tests = ["-p", "0", "-n", &s(o.tg), "-d", &s(o.depth)].map(String::from);
        invoke(&tests, true)?;
    }
    r["probe"] = probe.finish(o.starved);
    Ok(r)
}

fn starved(run: &Value) -> bool {
    crate::bench_probe::starved(&run["probe"])
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Strata / llama.cpp for one test of one round's entry, if both ran it.
fn ratio(entry: &Value, key: &str) -> Option<f64> {
    let s = entry["strata"][format!("{key}_tps")].as_f64()?;
    let l = entry["llama_cpp"][format!("{key}_tps")].as_f64()?;
    (l > 0.0).then(|| s / l)
}

fn file_name(model: &str) -> String {
    Path::new(model)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    if args.iter().any(|a| a == "--gpu") {
        return crate::bench_gpu::run(args);
    }
    let o = parse(args)?;
    let root = workspace_root();
    let llama_bin = std::env::var_os("LLAMA_BENCH").map(PathBuf::from);
    if let Some(b) = &llama_bin {
        if !b.exists() {
            bail!("LLAMA_BENCH={} does not exist", b.display());
        }
    } else {
        eprintln!("bench: LLAMA_BENCH is not set; Strata only");
    }
    let serving_peer = if o.serving {
        let p = std::env::var_os("LLAMA_SERVER")
            .map(PathBuf::from)
            .context("bench: --serving needs LLAMA_SERVER=/path/to/llama-server")?;
        if !p.exists() {
            bail!("LLAMA_SERVER={} does not exist", p.display());
        }
        Some(p)
    } else {
        None
    };
    eprintln!("bench: building cpu_bench (release) ...");
    let bench_bin = build_cpu_bench(&root)?;

    let mut rounds = Vec::new();
    for round in 1..=o.rounds {
        let mut entries = Vec::new();
        for model in &o.models {
            let mut entry = json!({ "model": model.display().to_string() });
            let strata_first = round % 2 == 1;
            for strata_turn in [strata_first, !strata_first] {
                if strata_turn {
                    eprintln!("bench: round {round}: strata {} ...", model.display());
                    entry["strata"] = strata(&bench_bin, &o, model)?;
                } else if let Some(bin) = &llama_bin {
                    eprintln!("bench: round {round}: llama-bench {} ...", model.display());
                    entry["llama_cpp"] = llama(bin, &o, model)?;
                }
            }
            entry["starved"] = json!(starved(&entry["strata"]) || starved(&entry["llama_cpp"]));
            entries.push(entry);
        }
        rounds.push(json!({ "round": round, "results": entries }));
    }
    let serving = match &serving_peer {
        Some(peer) => crate::bench_serving::run(&root, &o, peer, Path::new(SERVING_MODEL))?,
        None => Value::Null,
    };

    // The summary: per model and test, the median ratio over the rounds where neither
    // engine was starved.
    let mut summary = Vec::new();
    for model in &o.models {
        let name = model.display().to_string();
        for (key, _) in TESTS {
            let entries = rounds
                .iter()
                .flat_map(|r| r["results"].as_array().into_iter().flatten())
                .filter(|e| e["model"] == name.as_str());
            let (clean, starved): (Vec<_>, Vec<_>) = entries
                .filter_map(|e| {
                    ratio(e, key).map(|x| (x, !e["starved"].as_bool().unwrap_or(false)))
                })
                .partition(|&(_, clean)| clean);
            let clean: Vec<f64> = clean.into_iter().map(|(x, _)| x).collect();
            summary.push(json!({
                "model": name, "test": key,
                "median_clean_ratio": median(clean.clone()),
                "clean_rounds": clean.len(),
                "starved_rounds": starved.len(),
            }));
        }
    }

    let report = json!({
        "commit": commit(&root),
        "date": output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
            .unwrap_or_default()
            .trim(),
        "cpu": cpu_name(),
        "threads": o.threads,
        "pp": o.pp,
        "tg": o.tg,
        "depth": o.depth,
        "reps": o.reps,
        "rounds": rounds,
        "starved_limit_cores": o.starved,
        "peer_file_layout": o.peer_file_layout,
        "summary": summary,
        "serving": serving,
    });
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("cpu.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;
    print_tables(&report, &o);
    println!("(JSON: {})", path.display());
    Ok(())
}

fn label(key: &str, o: &Opts) -> String {
    match key {
        "pp" => format!("pp{}", o.pp),
        "tg" => format!("tg{}", o.tg),
        _ => format!("tg{}@d{}", o.tg, o.depth),
    }
}

fn print_tables(report: &Value, o: &Opts) {
    println!();
    println!(
        "CPU, {} threads, {} ({}), {}; llama.cpp {}",
        o.threads,
        report["cpu"].as_str().unwrap_or(""),
        report["commit"].as_str().unwrap_or(""),
        report["date"].as_str().unwrap_or(""),
        if o.peer_file_layout {
            "with -fa 0 --repack 0"
        } else {
            "with its defaults"
        }
    );
    println!("| round | model | test | Strata tok/s | llama.cpp tok/s | ratio | load avg | others + steal (cores): Strata / llama.cpp |");
    println!("|---:|---|---|---:|---:|---:|---:|---|");
    let cores = |run: &Value| crate::bench_probe::cell(&run["probe"]);
    for r in report["rounds"].as_array().into_iter().flatten() {
        for e in r["results"].as_array().into_iter().flatten() {
            let name = file_name(e["model"].as_str().unwrap_or(""));
            for (key, _) in TESTS {
                let tps = |run: &Value| run[format!("{key}_tps")].as_f64();
                let (s, l) = (tps(&e["strata"]), tps(&e["llama_cpp"]));
                if s.is_none() && l.is_none() {
                    continue;
                }
                let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
                let load = e["strata"]["probe"]["load_average"]
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.2}"));
                println!(
                    "| {} | {name} | {} | {} | {} | {} | {load} | {} / {} |",
                    r["round"],
                    label(key, o),
                    f(s),
                    f(l),
                    ratio(e, key).map_or("-".into(), |x| format!("{x:.2}")),
                    cores(&e["strata"]),
                    cores(&e["llama_cpp"]),
                );
            }
        }
    }
    println!();
    println!(
        "| model | test | Strata / llama.cpp, median of clean rounds | clean rounds | starved |"
    );
    println!("|---|---|---:|---:|---:|");
    for s in report["summary"].as_array().into_iter().flatten() {
        let Some(key) = s["test"].as_str() else {
            continue;
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            file_name(s["model"].as_str().unwrap_or("")),
            label(key, o),
            s["median_clean_ratio"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
            s["clean_rounds"],
            s["starved_rounds"],
        );
    }
    if !report["serving"].is_null() {
        crate::bench_serving::print_table(&report["serving"]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(super::median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(super::median(vec![]), None);
    }
}
