//! What a step reports back, per request.

use crate::SeqId;

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub id: SeqId,
    pub kind: EventKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// One generated token. A request's tokens arrive in order and exactly once, preemption
    /// included.
    Token {
        token: u32,
        /// Log-probability of `token` under the model's raw distribution (when the request
        /// asked for logprobs).
        logprob: Option<f32>,
        /// The most likely tokens with their log-probabilities, most likely first (empty
        /// unless asked for).
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request's last event.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache when the request was first admitted.
        cached_tokens: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS id, a stop sequence or the stop function.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    Cancelled,
    Error(String),
}
