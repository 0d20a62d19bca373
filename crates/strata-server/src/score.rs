//! `strata score`: teacher-forced logits of given token ids, for parity checks against a
//! reference implementation (scripts/reference/gemma4_real_shape_parity.py).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use strata_kv::KvCacheDtype;

/// `strata score`'s flags.
#[derive(Args)]
pub struct ScoreArgs {
    /// A model directory, `config.json`, or `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// Where and how the weights are placed.
    #[command(flatten)]
    pub placement: crate::placement::PlacementArgs,
    /// Token ids: a JSON array of integers.
    #[arg(long)]
    pub ids: PathBuf,
    /// Where to write `len(ids) x vocab` little-endian f32 logits (`passes x vocab` with
    /// `--last-rows`).
    #[arg(long)]
    pub out: PathBuf,
    /// auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Score the last N tokens one decode step at a time.
    #[arg(long, default_value_t = 0)]
    pub decode_tail: usize,
    /// Ask each pass for its last position's logits only, as generation does (Gemma-4's
    /// KV-shared layers then run that row alone); the output holds one row per pass.
    #[arg(long)]
    pub last_rows: bool,
    /// Run the whole scoring this many times (the first warms up) and report the last.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
}

/// Runs `strata score`: computes the logits of the ids and writes them to `--out`.
pub fn run(a: &ScoreArgs) -> anyhow::Result<()> {
    let kv = a.kv_cache_dtype;
    let text = std::fs::read_to_string(&a.ids).with_context(|| a.ids.display().to_string())?;
    let ids: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{}: want a JSON array of token ids", a.ids.display()))?;
    if ids.is_empty() || a.decode_tail >= ids.len() || a.prefill_chunk == 0 {
        anyhow::bail!(
            "{} ids with --decode-tail {} and --prefill-chunk {}: nothing to prefill",
            ids.len(),
            a.decode_tail,
            a.prefill_chunk
        );
    }
    let t0 = Instant::now();
    let model = a
        .placement
        .load(&a.model)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let load_s = t0.elapsed().as_secs_f64();
    let head = ids.len() - a.decode_tail;
    let mut passes: Vec<usize> = (0..head)
        .step_by(a.prefill_chunk)
        .map(|s| a.prefill_chunk.min(head - s))
        .collect();
    passes.extend(std::iter::repeat_n(1, a.decode_tail));
    let mut logits = Vec::new();
    let mut secs = 0.0;
    for _ in 0..a.repeat.max(1) {
        let t = Instant::now();
        logits = model.score(&ids, &passes, kv, a.last_rows)?;
        secs = t.elapsed().as_secs_f64();
    }
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| a.out.display().to_string())?,
    );
    for v in &logits {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    let report = serde_json::json!({
        "device": model.runtime.device_name(),
        "tokens": ids.len(),
        "vocab": model.config().vocab_size,
        "passes": passes.len(),
        "rows": logits.len() / model.config().vocab_size,
        "load_s": load_s,
        "score_s": secs,
    });
    println!("{report}");
    Ok(())
}
