//! `cargo xtask bench --cpu`: Strata's CPU throughput next to llama.cpp's, measured the same
//! way in the same run.
//!
//! Strata runs through the `cpu_bench` example (release build, `RAYON_NUM_THREADS` = the
//! thread count): pp = one prompt of `--pp` pseudo-random tokens in one batch, tg = `--tg`
//! greedy decode steps after a one-token prompt, each repeated `--reps` times. With
//! `LLAMA_BENCH=/path/to/llama-bench`, each model is then run through
//! `llama-bench -m MODEL -p PP -n TG -t THREADS -r REPS -fa 0` (plus `--repack 0` /
//! `--no-repack` when that build has the flag, so its weights stay in the file's layout as
//! Strata's do) right after Strata's run of the same model, and the table shows
//! Strata / llama.cpp. The table is printed last; everything also goes to
//! `target/bench/cpu.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::{json, Value};

const DEFAULT_MODELS: [&str; 2] = [
    "models/gemma-3-270m-q4_k_m.gguf",
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
];

struct Opts {
    models: Vec<PathBuf>,
    threads: usize,
    pp: usize,
    tg: usize,
    reps: usize,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        models: vec![],
        threads: 2,
        pp: 512,
        tg: 128,
        reps: 3,
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
            "--reps" => o.reps = val()?.parse()?,
            other => bail!("bench: unknown argument {other}"),
        }
    }
    if !cpu {
        bail!("bench: say --cpu or --gpu (cargo xtask bench --cpu | --gpu)");
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

fn output(cmd: &mut Command) -> anyhow::Result<String> {
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

fn strata(root: &Path, o: &Opts, model: &Path) -> anyhow::Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let text = output(
        Command::new(cargo)
            .current_dir(root)
            .env("RAYON_NUM_THREADS", o.threads.to_string())
            .args([
                "run",
                "--release",
                "--quiet",
                "-p",
                "xtask",
                "--example",
                "cpu_bench",
                "--",
                "--model",
            ])
            .arg(model)
            .args(["--pp", &o.pp.to_string()])
            .args(["--tg", &o.tg.to_string()])
            .args(["--reps", &o.reps.to_string()]),
    )?;
    let line = text.lines().last().context("cpu_bench printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// llama-bench's pp and tg results (tokens/s mean and sd) for one model.
fn llama(bin: &Path, o: &Opts, model: &Path) -> anyhow::Result<(Value, Vec<String>)> {
    let help = Command::new(bin)
        .arg("--help")
        .output()
        .map(|h| {
            String::from_utf8_lossy(&h.stdout).into_owned() + &String::from_utf8_lossy(&h.stderr)
        })
        .unwrap_or_default();
    let mut args: Vec<String> = vec!["-m".into(), model.display().to_string()];
    for (flag, v) in [
        ("-p", o.pp),
        ("-n", o.tg),
        ("-t", o.threads),
        ("-r", o.reps),
    ] {
        args.push(flag.into());
        args.push(v.to_string());
    }
    args.extend(["-fa".into(), "0".into()]);
    if help.contains("--no-repack") {
        args.push("--no-repack".into());
    } else if help.contains("--repack") {
        args.extend(["--repack".into(), "0".into()]);
    }
    args.extend(["-o".into(), "json".into()]);
    let text = output(Command::new(bin).args(&args))?;
    let runs: Vec<Value> = serde_json::from_str(&text).context("llama-bench JSON")?;
    let mut r = json!({});
    for run in runs {
        let key = if run["n_gen"].as_u64().unwrap_or(0) > 0 {
            "tg"
        } else {
            "pp"
        };
        r[format!("{key}_tps")] = run["avg_ts"].clone();
        r[format!("{key}_sd")] = run["stddev_ts"].clone();
        r["build_commit"] = run["build_commit"].clone();
    }
    Ok((r, args))
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
    let mut results = Vec::new();
    for model in &o.models {
        eprintln!("bench: strata {} ...", model.display());
        let s = strata(&root, &o, model)?;
        let mut entry = json!({ "model": model.display().to_string(), "strata": s });
        if let Some(bin) = &llama_bin {
            eprintln!("bench: llama-bench {} ...", model.display());
            let (l, cmd) = llama(bin, &o, model)?;
            entry["llama_cpp"] = l;
            entry["llama_bench_args"] = json!(cmd);
        }
        results.push(entry);
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
        "reps": o.reps,
        "results": results,
    });
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("cpu.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;

    println!();
    println!(
        "CPU, {} threads, {} ({}), {}",
        o.threads,
        report["cpu"].as_str().unwrap_or(""),
        report["commit"].as_str().unwrap_or(""),
        report["date"].as_str().unwrap_or("")
    );
    println!(
        "| {:<40} | {:>6} | {:>16} | {:>16} | {:>7} |",
        "model", "test", "strata tok/s", "llama.cpp tok/s", "ratio"
    );
    println!(
        "|{:-<42}|{:->8}|{:->18}|{:->18}|{:->9}|",
        "", "", "", "", ""
    );
    for r in report["results"].as_array().into_iter().flatten() {
        let name = Path::new(r["model"].as_str().unwrap_or(""))
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (key, n) in [("pp", o.pp), ("tg", o.tg)] {
            let cell = |v: &Value| match (
                v[format!("{key}_tps")].as_f64(),
                v[format!("{key}_sd")].as_f64(),
            ) {
                (Some(m), Some(sd)) => (format!("{m:.2} ± {sd:.2}"), Some(m)),
                (Some(m), None) => (format!("{m:.2}"), Some(m)),
                _ => ("-".to_string(), None),
            };
            let (s, sm) = cell(&r["strata"]);
            let (l, lm) = cell(&r["llama_cpp"]);
            let ratio = match (sm, lm) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            println!(
                "| {name:<40} | {:>6} | {s:>16} | {l:>16} | {ratio:>7} |",
                format!("{key}{n}")
            );
        }
    }
    println!("(JSON: {})", path.display());
    Ok(())
}
