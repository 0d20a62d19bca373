//! The engine without the HTTP server: the tiny random Llama of `tests/fixtures/tiny/llama-tiny`
//! loaded on the CPU, `Engine::start` (a KV pool sized from a byte budget, the scheduler on a
//! thread of its own), one request of token ids submitted, and its updates read as they
//! stream back on a tokio channel. The fixture has no tokenizer, so the updates carry ids only.
use std::path::Path;

use strata_engine::{Device, Engine, EngineOptions, GenerationRequest, LoadedModel, Update};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama-tiny");
    let loaded = LoadedModel::load(&dir, Device::Cpu)?;
    let opts = EngineOptions {
        kv_budget_bytes: 8 << 20,
        ..Default::default()
    };
    let engine = Engine::start(loaded, "llama-tiny".into(), opts)?;
    let plan = engine.status().plan.ok_or("no pool")?;
    println!("pool: {} pages of {} tokens", plan.full, plan.page_size);

    let request = GenerationRequest {
        ignore_eos: true,
        ..GenerationRequest::new(vec![1, 5, 9, 13], 6)
    };
    // Dropping the guard would cancel the request (a client that went away).
    let (_guard, mut updates) = engine.submit(request)?;
    while let Some(update) = updates.recv().await {
        match update {
            Update::Token { id, .. } => println!("token {id}"),
            Update::PromptLogprobs { .. } => {}
            Update::Finished { reason, usage, .. } => {
                println!(
                    "finished: {reason} ({} prompt, {} completion tokens)",
                    usage.prompt_tokens, usage.completion_tokens
                );
                break;
            }
        }
    }
    engine.shutdown();
    Ok(())
}
