//! One forward step's input and output.

use crate::sampling::{RowAdjust, SamplingParams, TokenLogprobs};
use crate::RequestId;

/// Which logits a sequence wants from this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LogitsMode {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last token's (decode, or the last prefill chunk).
    Last,
    /// Every token's (teacher-forced scoring, speculative verification).
    All,
    /// Only the greedy choice for the last token (argmax, ties to the lowest id), computed
    /// where the logits are: a GPU then sends back one id instead of a vocabulary of floats.
    Argmax,
    /// A token for the last token drawn with these settings and this uniform
    /// (`strata_types::sampling::sample`; greedy settings take the argmax), where the
    /// logits are, as for `Argmax`; with `logprobs`, also the token's logprob and that many
    /// top logprobs of the raw distribution (`strata_types::sampling::token_logprobs`).
    Draw {
        /// The sampling settings of the draw.
        params: SamplingParams,
        /// The draw's 64-bit uniform ([`crate::sampling::draw_uniform`]).
        uniform: u64,
        /// How many top logprobs to return with the token; `None` returns no logprobs.
        logprobs: Option<usize>,
    },
}

impl LogitsMode {
    /// Whether the step returns a token for this sequence (computed where the logits are)
    /// rather than logits.
    pub fn picks(&self) -> bool {
        matches!(self, LogitsMode::Argmax | LogitsMode::Draw { .. })
    }
}

/// A run of consecutive tokens of one sequence: a prefill chunk or a decode token.
#[derive(Clone, Debug)]
pub struct SeqChunk {
    /// The KV-pool request whose pages hold this sequence (already extended to cover
    /// `start + tokens.len()` positions).
    pub request: RequestId,
    /// The token ids of this chunk, in order.
    pub tokens: Vec<u32>,
    /// Absolute position of `tokens[0]`.
    pub start: usize,
    /// Which logits (or picked token) this chunk wants back.
    pub logits: LogitsMode,
}

/// Several sequences at different positions, computed in one pass.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    /// The sequences of this step, each with its own chunk.
    pub seqs: Vec<SeqChunk>,
    /// Logit adjustments (bias, penalties, `min_tokens`) of rows whose token is picked
    /// where the logits are (`Argmax` and `Draw` sequences, the rows of a picked-rows
    /// step), applied after the final softcap, before the pick. `row` indexes the step's
    /// logits rows: each sequence's wanted rows in batch order (one for `Last`, `Argmax`
    /// and `Draw`, one a token for `All`), so in a decode step it is the sequence's
    /// index. Marks among the pending tokens read the tokens the step is fed from.
    pub adjust: Vec<RowAdjust>,
    /// Logits rows (as `adjust` counts them) whose pick waits for a grammar mask, given
    /// after the launch (`StepModel::pick_masked` in `strata-sched`): the caller computes
    /// the masks on the host while the forward pass runs.
    pub masked: Vec<usize>,
    /// Per sequence (in batch order), the LoRA adapter its rows run with (0 for none, else
    /// an id the model has loaded); empty when no sequence has one.
    pub adapters: Vec<u32>,
    /// Rows whose input is given as embeddings rather than looked up from their token ids
    /// (an image's or a clip's soft tokens): each run of rows is written over the token
    /// embeddings, unscaled; their per-layer inputs take the pad token's identity part and
    /// project the written rows, as transformers does for a placeholder. Empty for
    /// text-only steps.
    pub embeds: Vec<RowEmbeds>,
}

/// A run of a sequence's rows given as embeddings.
#[derive(Clone, Debug, PartialEq)]
pub struct RowEmbeds {
    /// The sequence (index into `seqs`).
    pub seq: usize,
    /// The run's first row within that sequence's chunk.
    pub first: usize,
    /// `rows x hidden` values, row after row.
    pub values: std::sync::Arc<[f32]>,
}

impl ForwardBatch {
    /// The adapter of sequence `i` (0 for none).
    pub fn adapter(&self, i: usize) -> u32 {
        self.adapters.get(i).copied().unwrap_or(0)
    }

    /// Whether some sequence runs with an adapter.
    pub fn has_adapters(&self) -> bool {
        self.adapters.iter().any(|&a| a != 0)
    }
}

/// Logits per sequence of the batch, in batch order: `rows x vocab` values each (0, 1 or
/// the chunk's length rows, per its `LogitsMode`; none for `Argmax` and `Draw`), and for
/// `Argmax` and `Draw` sequences the chosen token.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// Vocabulary size: the length of one logits row.
    pub vocab: usize,
    /// Per sequence, its logits rows concatenated (`rows x vocab` values; empty when it
    /// asked for none).
    pub logits: Vec<Vec<f32>>,
    /// Per sequence, the token picked for `Argmax` and `Draw` sequences; `None` for the others.
    pub tokens: Vec<Option<u32>>,
    /// The logprobs of the tokens of `Draw` sequences that asked for them.
    pub logprobs: Vec<Option<TokenLogprobs>>,
}

impl ForwardOutput {
    /// The last row of sequence `i`'s logits, if it asked for any.
    pub fn last(&self, i: usize) -> Option<&[f32]> {
        let l = &self.logits[i];
        (l.len() >= self.vocab && self.vocab > 0).then(|| &l[l.len() - self.vocab..])
    }

    /// The token of sequence `i`, if it asked for `Argmax` or `Draw`.
    pub fn token(&self, i: usize) -> Option<u32> {
        self.tokens.get(i).copied().flatten()
    }

    /// The logprobs of sequence `i`'s token, if it asked for them.
    pub fn token_logprobs(&self, i: usize) -> Option<&TokenLogprobs> {
        self.logprobs.get(i)?.as_ref()
    }

    /// An output of `n` sequences with nothing in it yet.
    pub fn empty(vocab: usize, n: usize) -> Self {
        Self {
            vocab,
            logits: vec![vec![]; n],
            tokens: vec![None; n],
            logprobs: vec![None; n],
        }
    }
}
