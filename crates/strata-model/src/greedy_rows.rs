//! A step that returns the token of every wanted row (greedy, or drawn where asked) and
//! keeps those rows' hidden states: what speculative decoding needs from the target (the
//! verification of a run of drafts, and the state the drafter starts from).

use strata_kernels::sampling::{RowAdjust, RowDraw, RowMask, TokenLogprobs};
use strata_kernels::Backend;

use crate::batch::{ForwardBatch, LogitsMode};
use crate::error::{ModelError, Result};
use crate::forward::{HiddenOut, StepInputs};
use crate::kv_cache::KvCache;
use crate::model::Model;

/// What [`Model::forward_greedy_rows`] and [`Model::forward_picked_rows`] return.
pub struct GreedyRows<B: Backend> {
    /// Per sequence, the token of each row it asked for (one for `Last`, one a token for
    /// `All`, none for `None`): the greedy token (argmax of the softcapped logits, ties to
    /// the lowest id), or the row's draw where a [`RowDraw`] asked for one.
    pub tokens: Vec<Vec<u32>>,
    /// Per sequence and row, the logprobs a draw asked for (empty when nothing was drawn).
    pub logprobs: Vec<Vec<Option<TokenLogprobs>>>,
    /// Those rows under the final norm (what the output projection reads), `[rows, hidden]`
    /// in the order of `tokens` flattened; `None` when no row was asked for.
    pub hidden: Option<B::Buffer>,
}

/// How a picked-rows step chooses the tokens of its wanted rows, past the batch's
/// adjustments (indices into the wanted rows, in order): the rows drawn (the rest are
/// greedy), and the rows a grammar masks first.
#[derive(Clone, Copy, Debug, Default)]
pub struct RowChoices<'a> {
    /// The rows drawn with their settings and uniforms.
    pub draws: &'a [RowDraw],
    /// The rows masked, after their adjustments.
    pub masks: &'a [RowMask],
}

impl<B: Backend> Model<B> {
    /// Runs `batch` (sequences asking `None`, `Last` or `All`) and returns the greedy token
    /// of every row asked for, with those rows' final-normed hidden states left on the
    /// backend. Only the token ids cross to the host.
    pub fn forward_greedy_rows<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
    ) -> Result<GreedyRows<B>> {
        self.forward_picked_rows(kv, batch, RowChoices::default())
    }

    /// As [`Model::forward_greedy_rows`], with the rows of `choices.draws` drawn with their
    /// settings and uniforms, and scored where they ask, exactly as a decode step draws its
    /// last row (`Backend::pick_start`); the rows of `choices.masks` masked first.
    pub fn forward_picked_rows<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
        choices: RowChoices,
    ) -> Result<GreedyRows<B>> {
        if let Some(s) = batch.seqs.iter().find(|s| {
            !matches!(
                s.logits,
                LogitsMode::None | LogitsMode::Last | LogitsMode::All
            )
        }) {
            return Err(ModelError::Invalid(format!(
                "a greedy-rows step takes None, Last or All logits, not {:?}",
                s.logits
            )));
        }
        let b = &self.backend;
        let prep = self.prepare(batch)?;
        if let Some(rows) = kv.replay_rows(self, batch, &prep, choices)? {
            return Ok(rows);
        }
        kv.begin_step(b, batch)?;
        let inputs = StepInputs {
            ids: b.upload_index(&prep.ids)?,
            positions: b.upload_index(&prep.positions)?,
            lora: None,
        };
        let mut hidden = None;
        let (mut logits, counts) = self.run(
            kv,
            batch,
            &prep,
            &inputs,
            None,
            Some(HiddenOut::Keep(&mut hidden)),
        )?;
        let (tokens, logprobs) = match &mut logits {
            Some(l) => pick_rows(self, l, &counts, &batch.adjust, choices)?,
            None => (counts.iter().map(|_| Vec::new()).collect(), Vec::new()),
        };
        Ok(GreedyRows {
            tokens,
            logprobs,
            hidden,
        })
    }
}

/// Per sequence, its rows' tokens, and their logprobs (empty when nothing was drawn).
pub(crate) type RowPicks = (Vec<Vec<u32>>, Vec<Vec<Option<TokenLogprobs>>>);

/// The tokens of the first `counts.iter().sum()` rows of `logits`, split per sequence
/// (`counts` rows each): the argmax, or for the rows of `choices.draws` the draw (with the
/// logprobs it asks for); the rows of `adjust` adjusted first, then those of
/// `choices.masks` masked.
pub(crate) fn pick_rows<B: Backend>(
    model: &Model<B>,
    logits: &mut B::Buffer,
    counts: &[usize],
    adjust: &[RowAdjust],
    choices: RowChoices,
) -> Result<RowPicks> {
    let b = model.backend();
    let vocab = model.config().vocab_size;
    let rows: usize = counts.iter().sum();
    let draws = choices.draws;
    let cap = model.prepare_picks(logits, adjust.to_vec(), choices.masks, None)?;
    let (ids, scores): (Vec<u32>, Vec<Option<TokenLogprobs>>) = if draws.is_empty() {
        (b.argmax_rows(logits, vocab, rows, cap)?, Vec::new())
    } else {
        let picked = b.pick_finish(b.pick_start(logits, vocab, rows, cap, draws)?)?;
        picked.into_iter().map(|p| (p.id, p.logprobs)).unzip()
    };
    let mut at = 0;
    let mut tokens = Vec::with_capacity(counts.len());
    let mut logprobs = Vec::new();
    for &k in counts {
        tokens.push(ids[at..at + k].to_vec());
        if !scores.is_empty() {
            logprobs.push(scores[at..at + k].to_vec());
        }
        at += k;
    }
    Ok((tokens, logprobs))
}
