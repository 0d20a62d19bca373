//! Warming a server up before it takes traffic.
//!
//! The first decode step of each batch-size bucket records its CUDA graph (an op-by-op
//! pass, the capture, the instantiation), and the first prefill steps meet their GEMM
//! shapes (whose kernels cuBLAS loads on first use) and the allocator its sizes for the
//! first time. Unwarmed, the first requests of a fresh server pay for all of it
//! (`docs/perf-notes.md` has the figures). So the server runs those steps once at startup,
//! through the ordinary request path.

use std::time::Instant;

use super::{Engine, GenerationRequest, Update};
use crate::{EngineError, Result};

/// The prompt length of the warm-up's step of several prompts, where one prompt may fill a
/// step: the length of a typical chat turn, and long enough for the prompts' own attention
/// kernels.
const SHORT_PROMPT: usize = 512;

/// What [`Engine::warm_up`] ran.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmUp {
    /// Concurrent requests of each decode round (one round per graph bucket).
    pub decode_batches: Vec<usize>,
    /// Prompts of each prefill round and their length.
    pub prefill: Vec<(usize, usize)>,
    /// Wall-clock seconds the warm-up took.
    pub seconds: f64,
}

/// The shapes to warm.
#[derive(Clone, Copy, Debug)]
pub struct WarmUpShape {
    /// The most requests decoding at once (`--max-running-requests`).
    pub max_running: usize,
    /// Tokens in one step (`--max-batch-tokens`).
    pub max_batch_tokens: usize,
    /// Prompt tokens of one request per step (`--prefill-chunk`).
    pub prefill_chunk: usize,
    /// Tokens a speculative round drafts (0: no drafter) and the most requests a round
    /// holds: decode rounds up to that many requests run long enough to draft, so the
    /// draft and verification graphs are captured too.
    pub draft_tokens: usize,
    /// The most requests a speculative round holds (`--draft-max-requests`).
    pub draft_max_requests: usize,
    /// The drafts come from prompt lookup: those rounds' prompts repeat themselves, so the
    /// lookup finds its drafts there.
    pub prompt_lookup: bool,
}

impl Engine {
    /// A decode step at every graph bucket up to `shape.max_running` sequences, largest
    /// first (one-token prompts, two tokens out, all submitted together: one prefill step,
    /// then one decode step of the whole round), then one full prefill step (as many
    /// prompts of `prefill_chunk` tokens as a step takes) and, where that is one prompt, a
    /// full step of shorter ones (half the chunk, at most 512 tokens). The warm-up's prompts are
    /// dropped from the prefix cache afterwards. Any request that fails fails the warm-up.
    pub async fn warm_up(&self, shape: WarmUpShape) -> Result<WarmUp> {
        let t0 = Instant::now();
        let max_running = shape.max_running.max(1);
        let batches: Vec<usize> = strata_model::decode_buckets(max_running)
            .into_iter()
            .map(|b| b.min(max_running))
            .collect();
        let mut first_id = 0;
        // Largest first: the decode graphs share a logits buffer sized by the first capture
        // (a larger bucket later would add a second one).
        for &n in batches.iter().rev() {
            // With a drafter: the prompt's token, a round that keeps the drafter's state,
            // then drafted rounds.
            let rounds = shape.draft_tokens > 0 && n <= shape.draft_max_requests;
            let out = if rounds { 3 + shape.draft_tokens } else { 2 };
            // A cycle longer than the drafts, twice and a bit, in which every suffix
            // occurs earlier with `draft_tokens` tokens after it.
            let cycle = shape.draft_tokens + 2;
            let len = match rounds && shape.prompt_lookup {
                true => 2 * cycle + 2,
                false => 1,
            };
            self.warm_round(n, (len, cycle), out, first_id).await?;
            first_id += n;
        }
        // The context must hold the prompt and the two tokens out.
        let fit = |n: usize| n.clamp(1, self.context_len.saturating_sub(2).max(1));
        let step = |len: usize| (shape.max_batch_tokens / len).clamp(1, max_running);
        let len = fit(shape.prefill_chunk);
        let mut prefill = vec![(step(len), len)];
        // Where one prompt fills the step, a burst of shorter prompts sharing a step runs
        // other kernels (the attention over several sequences in one launch), so a step of
        // those is warmed too.
        let short = fit((len / 2).min(SHORT_PROMPT));
        if prefill[0].0 == 1 && step(short) > 1 {
            prefill.push((step(short), short));
        }
        for &(prompts, len) in &prefill {
            self.warm_round(prompts, (len, len), 2, first_id).await?;
            first_id += prompts;
        }
        self.flush().await?;
        Ok(WarmUp {
            decode_batches: batches,
            prefill,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// `n` greedy requests of `len` prompt tokens and `out` tokens out, submitted together;
    /// request `r` starts with token `first_id + r` (wrapped into the vocabulary), so no two
    /// share a cached prefix. The prompt repeats its first `cycle` tokens.
    async fn warm_round(
        &self,
        n: usize,
        (len, cycle): (usize, usize),
        out: usize,
        first_id: usize,
    ) -> Result<()> {
        let vocab = self.vocab_size.max(2);
        let mut pending = Vec::with_capacity(n);
        for r in 0..n {
            let start = first_id + r;
            let prompt = (0..len)
                .map(|i| (1 + (start + (i % cycle) * 7919) % (vocab - 1)) as u32)
                .collect();
            let req = GenerationRequest {
                ignore_eos: true,
                ..GenerationRequest::new(prompt, out)
            };
            pending.push(self.submit(req)?);
        }
        for (mut guard, mut rx) in pending {
            loop {
                match rx.recv().await {
                    Some(Update::Token { .. } | Update::PromptLogprobs { .. }) => {}
                    Some(Update::Finished { reason, error, .. }) => {
                        guard.finished();
                        if let Some(e) = error {
                            return Err(EngineError::Internal(format!(
                                "warm-up request ({reason}): {e}"
                            )));
                        }
                        break;
                    }
                    None => {
                        return Err(EngineError::Internal(
                            "the engine stopped during the warm-up".into(),
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}
