//! `strata bench`: the engine benchmark (decode at batch sizes and context depths, prefill
//! of long prompts, KV pages that fit) with the decode roofline. Prints a table last and
//! writes JSON. See docs/benchmarks.md.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;
use strata_engine::DecodeShape;
use strata_kv::{KvCacheDtype, KvLayout, DEFAULT_WINDOW_RATIO};

/// `strata bench`'s flags.
#[derive(Args)]
pub struct BenchArgs {
    /// A model directory, `config.json`, or `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// Where and how the weights are placed.
    #[command(flatten)]
    pub placement: crate::placement::PlacementArgs,
    /// KV cache format: auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128")]
    pub batches: Vec<usize>,
    /// Context depths for decode.
    #[arg(long, value_delimiter = ',', default_value = "128,4096,16384")]
    pub depths: Vec<usize>,
    /// Prompt lengths for prefill (0: none).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,4096,16384")]
    pub prefill: Vec<usize>,
    /// Timed steps at each decode point (and timed rounds at each `--draft` point).
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
    /// Untimed decode steps before the timed ones.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Skip decode points whose KV would exceed this many tokens (batch x depth).
    #[arg(long, default_value_t = 2_200_000)]
    pub max_kv_tokens: usize,
    /// Queue each decode step before reading the one ahead of it, its ids fed from that
    /// step's tokens on the device (what `serve` does).
    #[arg(long)]
    pub overlap: bool,
    /// Decode steps draw every token with these settings (greedy by default), where the
    /// logits are, as `serve` does for sampled requests.
    #[command(flatten)]
    pub sampling: crate::sampling_args::SamplingArgs,
    /// Decode steps also report every token's logprob and this many top logprobs (at most
    /// 20), where the logits are, as `serve` does for requests with `logprobs`.
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Every decode step also takes this many whole prompts (a server's step that admits
    /// requests while others decode), each of `--mixed-len` tokens wanting its first token.
    #[arg(long, default_value_t = 0)]
    pub mixed_prompts: usize,
    /// Tokens of each `--mixed-prompts` prompt (on the first step; see `--mixed-len-step`).
    #[arg(long, default_value_t = 512)]
    pub mixed_len: usize,
    /// Each step's prompts are this many tokens longer than the step before's, so every
    /// step meets a row count for the first time (as a server's steps do).
    #[arg(long, default_value_t = 0)]
    pub mixed_len_step: usize,
    /// PEFT LoRA adapter directories (comma-separated): decode row `i` of every point runs
    /// with adapter `i mod N` (all of them resident at once).
    #[arg(long, value_delimiter = ',')]
    pub lora: Vec<PathBuf>,
    /// Write the results here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A Gemma-4 assistant: also measure speculative rounds (each of `--draft-batches`,
    /// `--depths` and `--draft-tokens`).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Tokens drafted a round, for `--draft`.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub draft_tokens: Vec<usize>,
    /// Requests drafting together in a round, for `--draft` (a server's
    /// `--draft-max-requests` bounds them).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub draft_batches: Vec<usize>,
}

/// Runs `strata bench`: prints the results as a table and writes them as JSON when asked.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let kv = a.kv_cache_dtype;
    let model = a.placement.load_with_draft(&a.model, a.draft.as_deref())?;
    let device = model.runtime.device_name();
    eprintln!("[bench] {} on {device}", a.model.display());
    if !a.lora.is_empty() {
        model.load_bench_adapters(&a.lora, 512)?;
        eprintln!(
            "[bench] decode rows spread over {} LoRA adapters",
            a.lora.len()
        );
    }

    // Roofline: weight bytes a decode step reads over the measured copy bandwidth.
    let (weight_bytes, bandwidth, free) = model.runtime.decode_roofline()?;
    let roofline = bandwidth.map(|bw| bw / weight_bytes);

    // Decode points carrying whole prompts say so in their label.
    let mut mixed = String::new();
    if a.mixed_prompts > 0 {
        mixed = format!(" + {} prompts of {}", a.mixed_prompts, a.mixed_len);
        if a.mixed_len_step > 0 {
            mixed += &format!(" (+{} a step)", a.mixed_len_step);
        }
    }
    let mut decode = Vec::new();
    for &depth in &a.depths {
        for &batch in &a.batches {
            if batch * depth > a.max_kv_tokens {
                continue;
            }
            let shape = DecodeShape {
                batch,
                depth,
                steps: a.steps,
                warmup: a.warmup,
                overlap: a.overlap,
                sampling: Some(a.sampling.params()),
                logprobs: a.logprobs,
                mixed_prompts: a.mixed_prompts,
                mixed_len: a.mixed_len,
                mixed_len_step: a.mixed_len_step,
                adapters: a.lora.len() as u32,
            };
            let r = model.bench_decode(shape, kv)?;
            eprintln!(
                "[bench] decode batch {batch} depth {depth}{mixed}: {:.2} ms/step, {:.1} tok/s",
                r.seconds_per_step * 1e3,
                r.tokens_per_second
            );
            decode.push(r);
        }
    }
    let mut rounds = Vec::new();
    if a.draft.is_some() {
        for &depth in &a.depths {
            for &batch in &a.draft_batches {
                for r in model.bench_speculative(batch, depth, &a.draft_tokens, a.steps, kv)? {
                    eprintln!(
                        "[bench] speculative batch {batch} depth {depth}, {} drafts: draft {:.2} ms, \
                         verify {:.2} ms, decode step {:.2} ms",
                        r.draft_tokens,
                        r.draft_seconds * 1e3,
                        r.verify_seconds * 1e3,
                        r.decode_seconds * 1e3
                    );
                    rounds.push(r);
                }
            }
        }
    }
    let mut prefill = Vec::new();
    for &n in a.prefill.iter().filter(|&&n| n > 0) {
        let r = model.bench_prefill(n, 2, kv)?;
        eprintln!(
            "[bench] prefill {n}: {:.1} ms ({:.1} ms queueing), {:.0} tok/s",
            r.seconds * 1e3,
            r.enqueue_seconds * 1e3,
            r.tokens_per_second
        );
        prefill.push(r);
    }
    // Pages the whole free device memory buys per KV format.
    let mut pages = Vec::new();
    if let Some(free) = free {
        for d in [
            KvCacheDtype::Bf16,
            KvCacheDtype::Fp8PerTokenHead,
            KvCacheDtype::Int8PerTokenHead,
        ] {
            let layout = KvLayout::for_config(model.config(), d)?;
            let plan = layout.plan_pages((free as f64 * 0.85) as u64, 16, DEFAULT_WINDOW_RATIO)?;
            pages.push(
                json!({"kv_cache_dtype": d.name(), "budget_bytes": (free as f64 * 0.85) as u64,
                "full_pages": plan.full, "window_pages": plan.window, "page_size": plan.page_size,
                "full_tokens": plan.full * plan.page_size}),
            );
        }
    }

    // Gemma-4's KV-shared layers run a prompt's last row only (the logits are the same).
    let trimmed = model.runtime.kv_shared_trimmed_layers();
    let report = json!({
        "model": a.model.display().to_string(),
        "device": device,
        "kv_cache_dtype": kv.name(),
        "decode_overlap": a.overlap,
        "decode_mixed_prompts": a.mixed_prompts, "decode_mixed_len": a.mixed_len,
        "decode_mixed_len_step": a.mixed_len_step,
        "decode_sampling": {"temperature": a.sampling.temperature, "top_k": a.sampling.top_k,
            "top_p": a.sampling.top_p, "min_p": a.sampling.min_p, "logprobs": a.logprobs},
        "weight_bytes_per_step": weight_bytes,
        "weight_bytes_resident": model.runtime.weight_bytes(),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "decode_roofline_tok_s_batch1": roofline,
        "prefill_last_row_only_layers": trimmed,
        "decode": decode.iter().map(|r| json!({"batch": r.batch, "depth": r.depth, "steps": r.steps,
            "ms_per_step": r.seconds_per_step * 1e3, "tokens_per_second": r.tokens_per_second})).collect::<Vec<_>>(),
        "prefill": prefill.iter().map(|r| json!({"tokens": r.tokens, "ms": r.seconds * 1e3,
            "enqueue_ms": r.enqueue_seconds * 1e3, "tokens_per_second": r.tokens_per_second}))
            .collect::<Vec<_>>(),
        "kv_pages": pages,
        "speculative": rounds.iter().map(|r| json!({"requests": r.requests, "depth": r.depth,
            "draft_tokens": r.draft_tokens,
            "draft_ms": r.draft_seconds * 1e3, "verify_ms": r.verify_seconds * 1e3,
            "decode_step_ms": r.decode_seconds * 1e3, "break_even_kept_drafts": r.break_even(),
            "tokens_per_second_by_kept_drafts": (0..=r.draft_tokens)
                .map(|k| r.tokens_per_second(k)).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    println!("\n| figure | value |\n|---|---|");
    println!(
        "| weights in the model's memory | {:.2} GB |",
        model.runtime.weight_bytes() as f64 / 1e9
    );
    if let (Some(bw), Some(rf)) = (bandwidth, roofline) {
        println!("| copy bandwidth | {:.2} TB/s |", bw / 1e12);
        println!(
            "| weight bytes per decode step | {:.2} GB |",
            weight_bytes / 1e9
        );
        println!("| decode roofline, batch 1 | {rf:.0} tok/s |");
    }
    for r in &decode {
        let frac = roofline
            .filter(|_| r.batch == 1)
            .map(|rf| format!(" ({:.0}% of roofline)", 100.0 * r.tokens_per_second / rf))
            .unwrap_or_default();
        println!(
            "| decode batch {} depth {}{mixed} | {:.1} tok/s, {:.2} ms/step{frac} |",
            r.batch,
            r.depth,
            r.tokens_per_second,
            r.seconds_per_step * 1e3
        );
    }
    if !prefill.is_empty() {
        let layers = model.runtime.config().num_layers();
        println!(
            "| prefill: layers run for the last row only | {trimmed} of {layers} (KV-shared) |"
        );
    }
    for r in &prefill {
        println!(
            "| prefill {} tokens | {:.1} ms ({:.1} ms queueing), {:.0} tok/s |",
            r.tokens,
            r.seconds * 1e3,
            r.enqueue_seconds * 1e3,
            r.tokens_per_second
        );
    }
    for r in &rounds {
        let rates: Vec<String> = (0..=r.draft_tokens)
            .map(|k| format!("{k}: {:.0}", r.tokens_per_second(k)))
            .collect();
        println!(
            "| speculative, batch {} depth {}, {} drafts a round | draft {:.2} ms + verify {:.2} ms \
             (decode step {:.2} ms); tok/s by drafts kept a request a round {}; break-even {:.2} kept |",
            r.requests,
            r.depth,
            r.draft_tokens,
            r.draft_seconds * 1e3,
            r.verify_seconds * 1e3,
            r.decode_seconds * 1e3,
            rates.join(", "),
            r.break_even()
        );
    }
    for p in &pages {
        println!(
            "| KV pages at {} | {} full pages ({} tokens) |",
            p["kv_cache_dtype"], p["full_pages"], p["full_tokens"]
        );
    }
    Ok(())
}
