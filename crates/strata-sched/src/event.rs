//! What a step reports back, per request.

use strata_types::sampling::TokenLogprobs;

use crate::SeqId;

/// Something that happened to one request during a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The request it concerns.
    pub id: SeqId,
    /// What happened.
    pub kind: EventKind,
}

/// The kinds of [`Event`].
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// One generated token. A request's tokens arrive in order and exactly once, preemption
    /// included.
    Token {
        /// The token id.
        token: u32,
        /// Log-probability of `token` under the model's raw distribution (when the request
        /// asked for logprobs).
        logprob: Option<f32>,
        /// The most likely tokens with their log-probabilities, most likely first (empty
        /// unless asked for).
        top_logprobs: Vec<(u32, f32)>,
    },
    /// Log-probabilities of prompt tokens (requests with `prompt_logprobs`), in order
    /// across events: `scores[i]` is that of prompt token `start + i` given the tokens
    /// before it. Token 0 has none, so the first event starts at 1; all come before the
    /// first `Token`.
    PromptLogprobs {
        /// Position of the first prompt token scored here.
        start: usize,
        /// Each token's logprob and its request's number of top alternatives.
        scores: Vec<TokenLogprobs>,
    },
    /// The request's last event.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens generated (reported as `Token` events).
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache when the request was first admitted.
        cached_tokens: usize,
    },
}

/// Why a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS id, a stop sequence or the stop function.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// Ended by [`Scheduler::cancel`](crate::Scheduler::cancel).
    Cancelled,
    /// The request failed: refused at admission (an empty or out-of-vocabulary prompt,
    /// invalid sampling settings, more than the model's context or the KV pool holds) or
    /// its forward pass failed; the message says why.
    Error(String),
}
