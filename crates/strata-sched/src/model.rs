//! The one trait the scheduler drives a model through.

use strata_kv::{HostStorage, KvPool, KvStorage, RequestId};
use strata_types::sampling::{RowAdjust, RowDraw, RowMask, TokenLogprobs};
use strata_types::{ForwardBatch, ForwardOutput};

use crate::SchedError;

/// One sequence of a speculative round: its pending token at `start` (slots already
/// allocated for `start..start + 1 + drafts`) and how many tokens to draft after it.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftRow {
    /// The sequence's request in the KV pool.
    pub request: RequestId,
    /// Position of `token` in the sequence.
    pub start: usize,
    /// The pending token (generated, its K/V not yet stored).
    pub token: u32,
    /// Tokens to draft after `token`.
    pub drafts: usize,
    /// The checked rows (`0..=drafts`) whose token is drawn rather than greedy: a sampled
    /// request's rows, each with the uniform of the token it yields.
    pub draws: Vec<RowDraw>,
    /// The logit adjustments of the checked rows (`row` = `0..=drafts`) as they stand
    /// before the drafts: the model counts the drafts ahead of row `j` (`j` of them) as
    /// its pending tokens.
    pub adjust: Vec<RowAdjust>,
    /// The LoRA adapter the sequence runs with (0: none): its drafts are checked under it.
    pub adapter: u32,
}

/// What a round computed for one row: the drafts, and the model's token after each
/// checked input (`[token, drafts..]`: `picked.len() == drafts.len() + 1`), greedy or drawn
/// as the row asked, with the logprobs a draw asked for (`logprobs` is empty when nothing
/// was drawn). The drafts equal to `picked` from the start are kept, then the model's token
/// after them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckedRow {
    /// The drafted tokens.
    pub drafts: Vec<u32>,
    /// The model's token after each checked input (`drafts.len() + 1` of them).
    pub picked: Vec<u32>,
    /// Per entry of `picked`, its logprobs where a draw asked for them (empty when nothing
    /// was drawn).
    pub logprobs: Vec<Option<TokenLogprobs>>,
}

/// A run of tokens to check: `tokens[0]` is the sequence's pending token at `start`, the rest
/// drafts made by the caller (slots already allocated for all of them).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckRow {
    /// The sequence's request in the KV pool.
    pub request: RequestId,
    /// Position of `tokens[0]` in the sequence.
    pub start: usize,
    /// The pending token, then the drafts.
    pub tokens: Vec<u32>,
    /// As [`DraftRow::draws`].
    pub draws: Vec<RowDraw>,
    /// As [`DraftRow::adjust`]: row `j` counts `tokens[1..=j]` as pending.
    pub adjust: Vec<RowAdjust>,
    /// The grammar masks of the checked rows (`row` = `0..tokens.len()`), applied after
    /// the adjustments: row `j`'s is the constraint's after `tokens[1..=j]`. Rows past a
    /// draft the grammar refuses have none (their tokens are never kept).
    pub masks: Vec<RowMask>,
    /// As [`DraftRow::adapter`].
    pub adapter: u32,
}

/// A speculative round's grammar masks, computed by the caller once the drafts exist:
/// called with a row's index in the round and its drafts, it returns that row's
/// [`CheckRow::masks`] (none for a request without a grammar).
pub type DraftMasks<'a> = dyn FnMut(usize, &[u32]) -> Result<Vec<RowMask>, String> + 'a;

impl CheckedRow {
    /// Leading drafts the model agreed with.
    pub fn agreed(&self) -> usize {
        self.drafts
            .iter()
            .zip(&self.picked)
            .take_while(|(d, g)| d == g)
            .count()
    }
}

/// A model that computes [`ForwardBatch`]es over the K/V in a pool of storage `S`.
///
/// A step is queued by `launch` and read by `finish`. It must store the K/V of every token
/// of the batch at its request's slots; `finish` returns, per sequence, the logits its
/// `LogitsMode` asks for (`vocab_size` values a row). A model whose steps can leave their
/// greedy tokens where they were computed ([`StepModel::feeds`]) lets the scheduler queue
/// the next decode step before reading the current one: that step's token ids are
/// `FED_TOKEN | i`, sequence `i`'s greedy token of the step passed as `fed`.
pub trait StepModel<S: KvStorage = HostStorage> {
    /// A step queued and not yet read.
    type Launched;

    /// Logits a row (the vocabulary's size).
    fn vocab_size(&self) -> usize;

    /// Positions the model can compute (`max_position_embeddings`); `None` for no limit.
    fn context_len(&self) -> Option<usize> {
        None
    }

    /// Queues `batch`'s step, storing its K/V in `kv`; `fed` is the step still in flight
    /// whose greedy tokens this one reads (only when [`StepModel::feeds`] allows it).
    fn launch(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
        fed: Option<&Self::Launched>,
    ) -> Result<Self::Launched, SchedError>;

    /// Waits for a launched step and returns its output.
    fn finish(&mut self, step: Self::Launched) -> Result<ForwardOutput, SchedError>;

    /// Whether a later `launch` can take `step`'s greedy tokens as `fed`.
    fn feeds(&self, _step: &Self::Launched) -> bool {
        false
    }

    /// Whether the model can hold a step's picks until the caller's grammar masks arrive
    /// ([`StepModel::pick_masked`]); else masked requests get their logits and are drawn
    /// by the caller.
    fn masks_picks(&self) -> bool {
        false
    }

    /// Queues the picks of a step launched with rows in `ForwardBatch::masked`, each of
    /// those rows masked by its entry of `masks` first (the caller computes them on the
    /// host while the step's forward pass runs). A step launched with `fed` takes `fed`'s
    /// ids as the caller read them (by sequence): the pending `FED_TOKEN | r` marks of its
    /// adjustments stand for them, and the feeding step is gone by now.
    fn pick_masked(
        &mut self,
        _step: &mut Self::Launched,
        _masks: &[RowMask],
        _fed: &[u32],
    ) -> Result<(), SchedError> {
        Err(SchedError::Other(
            "this model does not take grammar masks".into(),
        ))
    }

    /// Tokens a speculative round may draft for a sequence; 0 for a model without a
    /// drafter (the scheduler then never calls [`StepModel::speculate`]).
    fn draft_tokens(&self) -> usize {
        0
    }

    /// Whether the model can draft after the token at `position` of `request`: it kept
    /// the state of the round that computed that token. (The first round after a prompt,
    /// or after an ordinary step, drafts nothing and leaves that state.)
    fn can_draft(&self, _request: RequestId, _position: usize) -> bool {
        false
    }

    /// One speculative round over decode rows: drafts `row.drafts` tokens after each row's
    /// token, checks `[token, drafts..]` of every row in one target step (K/V stored at
    /// `start..`; each checked row greedy, or drawn as `row.draws` asks), and returns, per
    /// row, the drafts and the target's tokens. The caller drops the K/V past what it keeps.
    /// Once the drafts exist, `masks` gives each row's grammar masks (as
    /// [`CheckRow::masks`]), for a model that [`StepModel::masks_picks`].
    fn speculate(
        &mut self,
        _kv: &mut KvPool<S>,
        _rows: &[DraftRow],
        _masks: &mut DraftMasks,
    ) -> Result<Vec<CheckedRow>, SchedError> {
        Err(SchedError::Other("this model has no drafter".into()))
    }

    /// Whether the model can check drafts made by the caller ([`StepModel::verify`]).
    fn verifies(&self) -> bool {
        false
    }

    /// Computes every row of `rows` in one step (K/V stored at `start..`) and returns, per
    /// row, its drafts (`tokens[1..]`) and the token after each of its tokens (masked
    /// first where the row has masks, for a model that [`StepModel::masks_picks`]).
    fn verify(
        &mut self,
        _kv: &mut KvPool<S>,
        _rows: &[CheckRow],
    ) -> Result<Vec<CheckedRow>, SchedError> {
        Err(SchedError::Other("this model does not check drafts".into()))
    }

    /// One step, queued and read.
    fn forward(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, SchedError> {
        let step = self.launch(kv, batch, None)?;
        self.finish(step)
    }
}
