//! Strata's CPU throughput on one model, the way `llama-bench` measures it: prompt processing
//! of `--pp` tokens in one batch (pp), greedy decoding of `--tg` tokens one at a time (tg)
//! and, with `--depth D`, the same decoding after a prompt of `D` tokens, which is not
//! timed (llama-bench's `-d D`). Zero skips a test. Run by `cargo xtask bench --cpu`;
//! prints one JSON object per model on stdout.
//!
//! `--tokens PROMPT` instead prints the greedy continuation's token ids (for before/after
//! checks of kernel changes); `--margins PROMPT --expect ID,ID,...` feeds the prompt and the
//! expected continuation teacher-forced and prints, per position, our argmax, the expected
//! token and the top-1/top-2 logit margin (to tell near-ties from real divergences).

use std::path::PathBuf;
use std::time::Instant;

use strata_engine::{Device, GenerateParams, LoadedModel};

struct Args {
    model: PathBuf,
    pp: usize,
    tg: usize,
    depth: usize,
    reps: usize,
    tokens: Option<String>,
    margins: Option<String>,
    expect: Vec<u32>,
    n: usize,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        model: PathBuf::new(),
        pp: 512,
        tg: 128,
        depth: 0,
        reps: 3,
        tokens: None,
        margins: None,
        expect: vec![],
        n: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--model" => a.model = val()?.into(),
            "--pp" => a.pp = val()?.parse()?,
            "--tg" => a.tg = val()?.parse()?,
            "--depth" => a.depth = val()?.parse()?,
            "--reps" => a.reps = val()?.parse()?,
            "--tokens" => a.tokens = Some(val()?),
            "-n" => a.n = val()?.parse()?,
            "--margins" => a.margins = Some(val()?),
            "--expect" => {
                a.expect = val()?
                    .split(',')
                    .map(|t| t.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(!a.model.as_os_str().is_empty(), "--model is required");
    Ok(a)
}

/// Deterministic pseudo-random token ids below `vocab` (llama-bench also uses random ids).
fn prompt_ids(first: u32, n: usize, vocab: usize) -> Vec<u32> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut ids = vec![first];
    while ids.len() < n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ids.push(((s >> 33) % (vocab as u64 - 1000)) as u32 + 1000);
    }
    ids
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0).max(1.0);
    (m, var.sqrt())
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let model = LoadedModel::load(&a.model, Device::Cpu)?;
    if let Some(text) = &a.tokens {
        let prompt = model.encode_prompt(text)?;
        let p = GenerateParams {
            max_tokens: a.n,
            stop_at_eos: false,
            ..Default::default()
        };
        let out = model.generate(&prompt, &p)?;
        println!("{:?}", out.tokens);
        return Ok(());
    }
    if let Some(text) = &a.margins {
        return margins(&model, &model.encode_prompt(text)?, &a.expect);
    }
    let vocab = model.config().vocab_size;
    let bos = model
        .tokenizer
        .as_ref()
        .and_then(|t| t.bos_id())
        .unwrap_or(1);
    let pp_prompt = prompt_ids(bos, a.pp, vocab);
    let pp_params = GenerateParams {
        max_tokens: 1,
        stop_at_eos: false,
        prefill_chunk: a.pp,
        ..Default::default()
    };
    // tg: one BOS, then `tg` decode steps (the first token comes from the prefill logits).
    let tg_params = GenerateParams {
        max_tokens: a.tg + 1,
        stop_at_eos: false,
        ..Default::default()
    };
    // tg at depth: the prompt (BOS and `depth` ids) is prefilled, then `tg` steps timed.
    let depth_prompt = prompt_ids(bos, a.depth + 1, vocab);
    // Warm-up: page the weights in and spin up the thread pool.
    model.generate(&pp_prompt[..a.pp.clamp(1, 32)], &tg_params_small())?;
    let (mut pp, mut tg, mut tgd) = (Vec::new(), Vec::new(), Vec::new());
    let decode = |prompt: &[u32]| -> anyhow::Result<f64> {
        let out = model.generate(prompt, &tg_params)?;
        let steps = out.tokens.len().saturating_sub(1);
        Ok(steps as f64 * 1e3 / out.timings.predicted_ms)
    };
    for _ in 0..a.reps {
        if a.pp > 0 {
            let t = Instant::now();
            model.generate(&pp_prompt, &pp_params)?;
            pp.push(a.pp as f64 / t.elapsed().as_secs_f64());
        }
        if a.tg > 0 {
            tg.push(decode(&[bos])?);
        }
        if a.tg > 0 && a.depth > 0 {
            tgd.push(decode(&depth_prompt)?);
        }
    }
    let mut report = serde_json::json!({
        "model": a.model.display().to_string(),
        "threads": rayon_threads(),
    });
    for (key, n, runs) in [("pp", a.pp, &pp), ("tg", a.tg, &tg), ("tgd", a.tg, &tgd)] {
        if runs.is_empty() {
            continue;
        }
        let (m, sd) = mean_sd(runs);
        report[key] = n.into();
        report[format!("{key}_tps")] = m.into();
        report[format!("{key}_sd")] = sd.into();
        report[format!("{key}_runs")] = serde_json::json!(runs);
    }
    if !tgd.is_empty() {
        report["depth"] = a.depth.into();
    }
    println!("{report}");
    Ok(())
}

fn tg_params_small() -> GenerateParams {
    GenerateParams {
        max_tokens: 4,
        stop_at_eos: false,
        ..Default::default()
    }
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Teacher-forced logits of `prompt + expect`: per expected position, our argmax, the
/// expected token and our top-1/top-2 margin.
fn margins(model: &LoadedModel, prompt: &[u32], expect: &[u32]) -> anyhow::Result<()> {
    anyhow::ensure!(!expect.is_empty(), "--margins needs --expect");
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&expect[..expect.len() - 1]);
    let out = model.score(&seq, &[seq.len()], strata_kv::KvCacheDtype::Auto, false)?;
    let vocab = model.config().vocab_size;
    for (j, &want) in expect.iter().enumerate() {
        let row = &out[(prompt.len() - 1 + j) * vocab..(prompt.len() + j) * vocab];
        let mut idx: Vec<usize> = (0..vocab).collect();
        idx.select_nth_unstable_by(1, |&x, &y| row[y].total_cmp(&row[x]));
        let (top, second) = if row[idx[0]] >= row[idx[1]] {
            (idx[0], idx[1])
        } else {
            (idx[1], idx[0])
        };
        println!(
            "{j:3}: argmax {top:>7} expected {want:>7} margin {:.3}{}",
            row[top] - row[second],
            if top as u32 == want {
                ""
            } else {
                "  <- differs"
            }
        );
    }
    Ok(())
}
