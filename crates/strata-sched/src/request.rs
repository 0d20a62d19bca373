//! What a client asks for.

use std::fmt;

use strata_types::sampling::{LogitControls, SamplingParams};

/// A request's id in the scheduler, given by [`Scheduler::submit`](crate::Scheduler::submit).
/// Ids grow in submission order, which is also the order of priority (older first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A caller-side stop test, run after each generated token with every completion token so
/// far; `true` ends the request with [`FinishReason::Stop`](crate::FinishReason::Stop).
/// Text stop strings go through it: the caller detokenizes and searches its text (the
/// scheduler knows only token ids).
pub type StopFn = Box<dyn FnMut(&[u32]) -> bool + Send>;

/// One generation request.
pub struct Request {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Completion tokens at most.
    pub max_tokens: usize,
    /// How each token is chosen (temperature, top-k, top-p, min-p, seed).
    pub sampling: SamplingParams,
    /// The model's end-of-sequence ids; generating one ends the request (it is still
    /// reported as a token). Ignored with `ignore_eos`.
    pub stop_ids: Vec<u32>,
    /// Keep generating past `stop_ids` (up to `max_tokens`).
    pub ignore_eos: bool,
    /// Token sequences that end the request when the completion ends with one of them.
    pub stop_sequences: Vec<Vec<u32>>,
    /// A caller-side stop test (text stop strings).
    pub stop_fn: Option<StopFn>,
    /// Report the sampled token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Also score the prompt: each prompt token's log-probability given the tokens before
    /// it, with this many top alternatives (the first token has none), reported as
    /// [`EventKind::PromptLogprobs`](crate::EventKind::PromptLogprobs). Such a request
    /// computes its whole prompt (no prefix-cache hit) and may ask for `max_tokens` 0.
    pub prompt_logprobs: Option<usize>,
    /// What the request may generate (a grammar): its logits are masked before each draw,
    /// which then happens on the host, and it ends when the constraint is complete.
    pub constraint: Option<crate::Constraint>,
    /// Bias, penalties and `min_tokens`, applied to the logits before each draw. A request
    /// whose controls are not neutral is drawn on the host from its logits.
    pub controls: LogitControls,
    /// Ids that end the request like `stop_ids`, also with `ignore_eos` (`stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// The LoRA adapter the request runs with: 0 for none, else an id below
    /// [`MAX_ADAPTER_ID`] that the model has loaded. Its prefixes are cached apart from the
    /// base model's and other adapters' (their K/V differ).
    pub adapter: u32,
    /// Runs of prompt rows given as embeddings (an image's or a clip's soft tokens, at
    /// their placeholders); in prompt order, not overlapping.
    pub media: Vec<MediaInput>,
}

/// A run of prompt rows whose inputs are given as embeddings.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaInput {
    /// The run's first prompt position.
    pub start: usize,
    /// Rows of the run.
    pub rows: usize,
    /// `rows x width` values, row after row (the width is the model's hidden size).
    pub values: std::sync::Arc<[f32]>,
    /// A hash of the media's content: the prefix cache keys the run's rows by it, so the
    /// same image in a later prompt is a cache hit and another image never is.
    pub hash: u64,
}

impl MediaInput {
    /// The prefix cache's key of row `i` of the run: above every token id (bit 23 set,
    /// below the adapter bits), from the content hash and the row, so that a different
    /// image matches no row of this one but with odds of 2^-23 a row.
    pub(crate) fn row_key(&self, i: usize) -> u32 {
        let mut x = self.hash ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 33;
        (1 << 23) | (x as u32 & 0x7F_FFFF)
    }
}

/// Adapter ids are below this: the prefix cache keys an adapter's tokens with its id above
/// bit 24 (token ids stay below 2^24).
pub const MAX_ADAPTER_ID: u32 = 128;

impl Request {
    /// Greedy generation of up to `max_tokens` after `prompt`, no stop conditions.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_ids: Vec::new(),
            ignore_eos: false,
            stop_sequences: Vec::new(),
            stop_fn: None,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            controls: LogitControls::default(),
            stop_token_ids: Vec::new(),
            adapter: 0,
            media: Vec::new(),
        }
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt)
            .field("max_tokens", &self.max_tokens)
            .field("sampling", &self.sampling)
            .field("stop_ids", &self.stop_ids)
            .field("ignore_eos", &self.ignore_eos)
            .field("stop_sequences", &self.stop_sequences)
            .field("stop_fn", &self.stop_fn.as_ref().map(|_| "<fn>"))
            .field("logprobs", &self.logprobs)
            .field("prompt_logprobs", &self.prompt_logprobs)
            .field("constraint", &self.constraint)
            .field("controls", &self.controls)
            .field("stop_token_ids", &self.stop_token_ids)
            .field("adapter", &self.adapter)
            .field("media", &self.media.len())
            .finish()
    }
}
