//! `strata generate`: one prompt through the model, printing the continuation.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde_json::json;
use strata_engine::GenerateParams;
use strata_kv::KvCacheDtype;
use strata_tokenizer::ChatMessage;

use crate::step_budget;

/// `strata generate`'s flags.
#[derive(Args)]
pub struct GenerateArgs {
    /// A model directory, `config.json`, or `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// The prompt text (needs the model's tokenizer).
    #[arg(
        long,
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (for models without a tokenizer).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// How each token is chosen.
    #[command(flatten)]
    pub sampling: crate::sampling_args::SamplingArgs,
    /// Wrap the prompt as a user turn of the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Where and how the weights are placed.
    #[command(flatten)]
    pub placement: crate::placement::PlacementArgs,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object: prompt_tokens, tokens, text, timings.
    #[arg(long)]
    pub json: bool,
    /// A Gemma-4 assistant (its directory, or a `gemma4-assistant` GGUF): speculative
    /// decoding. The output is the one without drafts, greedy or drawn with the same seed.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Speculative decoding without a draft model: draft the tokens that followed the
    /// latest earlier occurrence of the last N tokens (down to 2) in the prompt and output.
    #[arg(long, value_name = "N", conflicts_with = "draft")]
    pub prompt_lookup: Option<usize>,
    /// Tokens drafted a round (by `--draft` or `--prompt-lookup`).
    #[arg(long, default_value_t = 3)]
    pub draft_tokens: usize,
    /// Prompt tokens a forward pass takes (default: 8192 on a GPU, 512 on the CPU, as
    /// `strata serve`).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
}

/// Runs `strata generate`: generates from the prompt and prints the text (or JSON).
pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    let kv_cache_dtype = a.kv_cache_dtype;
    let sampling = a.sampling.params();
    let model = a.placement.load_with_draft(&a.model, a.draft.as_deref())?;
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) if a.chat => model.encode_chat(&[ChatMessage::text("user", text)])?,
        (None, Some(text)) => model.encode_prompt(text)?,
        (None, None) => anyhow::bail!("give --prompt or --prompt-ids"),
    };
    let on_gpu = model.runtime.on_gpu();
    let step_tokens = step_budget::step_tokens(None, on_gpu);
    let prefill_chunk = step_budget::chunk_tokens(a.prefill_chunk, on_gpu, step_tokens);
    if prefill_chunk == 0 {
        anyhow::bail!("--prefill-chunk must be at least 1");
    }
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampling,
        kv_cache_dtype,
        stop_at_eos: !a.ignore_eos,
        draft_tokens: a.draft_tokens,
        prompt_lookup: a.prompt_lookup,
        prefill_chunk,
    };
    let out = model.generate(&prompt, &params)?;
    // Without a tokenizer (ids in, ids out) there is no text.
    let text = match model.tokenizer {
        Some(_) => model.decode(&out.tokens)?,
        None => String::new(),
    };
    if a.json {
        let t = out.timings;
        let report = json!({
            "prompt_tokens": prompt,
            "tokens": out.tokens,
            "text": text,
            "finish_reason": out.finish_reason,
            "timings": {
                "prompt_n": prompt.len(),
                "prompt_ms": t.prompt_ms,
                "prompt_per_second": t.prompt_per_second,
                "predicted_n": out.tokens.len(),
                "predicted_ms": t.predicted_ms,
                "predicted_per_second": t.predicted_per_second,
            },
            "draft": out.draft.map(|d| json!({"rounds": d.rounds, "drafted": d.drafted,
                "accepted": d.accepted, "tokens_per_round": d.tokens_per_round()})),
        });
        println!("{report}");
    } else {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s; generated: {} tokens, {:.1} tok/s ({})",
            prompt.len(),
            out.timings.prompt_per_second,
            out.tokens.len(),
            out.timings.predicted_per_second,
            out.finish_reason
        );
        if let Some(d) = out.draft {
            eprintln!(
                "drafts: {} kept of {} in {} rounds ({:.2} tokens a round)",
                d.accepted,
                d.drafted,
                d.rounds,
                d.tokens_per_round()
            );
        }
    }
    Ok(())
}
