//! Per-step limits of the scheduler.

use crate::SchedError;

/// How much work one scheduling step may take on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Requests holding KV at once (`--max-running-requests`).
    pub max_running_requests: usize,
    /// Tokens in one forward pass, decode tokens and prefill chunks together. Must be at
    /// least `max_running_requests` so every running request can decode in every step.
    pub max_batch_tokens: usize,
    /// Prompt tokens of one request per step (the prefill chunk).
    pub prefill_chunk: usize,
    /// Mixed with each request's id to seed requests that bring no seed of their own.
    pub seed: u64,
    /// Queue the next decode step before reading the current one, where the model can
    /// feed one step's tokens (greedy or drawn) to the next ([`crate::StepModel::feeds`]): the device
    /// then runs step after step while the host reads, reports and plans behind it.
    pub overlap: bool,
    /// Speculative rounds run while at most this many requests are running, all of them
    /// decoding with tokens the model picks (a model with a drafter,
    /// [`crate::StepModel::draft_tokens`], or with `prompt_lookup`).
    /// Past it a batch's decode step already reads its weights for many tokens, and
    /// verifying drafts costs more than it yields.
    pub draft_max_requests: usize,
    /// Draft by prompt lookup (a model that checks drafts, [`crate::StepModel::verifies`];
    /// not with a model that drafts itself): rounds as above, run when some request's
    /// latest tokens occurred earlier in it.
    pub prompt_lookup: Option<crate::PromptLookup>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_running_requests: 64,
            max_batch_tokens: 2048,
            prefill_chunk: 512,
            seed: 0x5EED,
            overlap: false,
            draft_max_requests: 4,
            prompt_lookup: None,
        }
    }
}

impl SchedulerConfig {
    /// Checks the settings can work (nonzero budgets, a batch token budget that covers
    /// every running request, sane prompt-lookup n-grams); `SchedError::Config` names the
    /// first that cannot.
    pub fn validate(&self) -> Result<(), SchedError> {
        let bad = |m: String| Err(SchedError::Config(m));
        if self.max_running_requests == 0 {
            return bad("max_running_requests must be at least 1".into());
        }
        if self.prefill_chunk == 0 {
            return bad("prefill_chunk must be at least 1".into());
        }
        if self.max_batch_tokens < self.max_running_requests {
            return bad(format!(
                "max_batch_tokens ({}) is below max_running_requests ({}): some running \
                 requests could not decode in a step",
                self.max_batch_tokens, self.max_running_requests
            ));
        }
        if let Some(l) = &self.prompt_lookup {
            l.validate().map_err(SchedError::Config)?;
        }
        Ok(())
    }
}
