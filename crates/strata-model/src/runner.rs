//! The model as the scheduler drives it: [`ModelRunner`] executes the scheduler's steps
//! (`strata_sched::StepModel`) on the model's backend. The scheduler sits below the model
//! and knows nothing of devices; this is where its plans meet a forward pass.

use std::sync::Arc;

use strata_kernels::sampling::{RowAdjust, RowDraw, RowMask};
use strata_kernels::Backend;
use strata_kv::{KvPool, KvStorage};
use strata_sched::{CheckRow, CheckedRow, SchedError, StepModel};

use crate::{
    ForwardBatch, ForwardOutput, KvCache, Launched, LogitsMode, Model, ModelError, RowChoices,
    SeqChunk,
};

impl From<ModelError> for SchedError {
    fn from(e: ModelError) -> Self {
        SchedError::Model(Box::new(e))
    }
}

/// The model behind a [`StepModel`] implementation: owned, or shared with other threads
/// (the engine keeps its own handle for metadata).
pub trait ModelHandle {
    /// The backend the model runs on.
    type Backend: Backend;
    /// The model.
    fn model(&self) -> &Model<Self::Backend>;
}

impl<B: Backend> ModelHandle for Model<B> {
    type Backend = B;
    fn model(&self) -> &Model<B> {
        self
    }
}

impl<B: Backend> ModelHandle for Arc<Model<B>> {
    type Backend = B;
    fn model(&self) -> &Model<B> {
        self
    }
}

/// A model (owned, or shared with other threads) as the scheduler's [`StepModel`].
pub struct ModelRunner<H>(pub H);

impl<B: Backend, S: KvStorage, H: ModelHandle<Backend = B>> StepModel<S> for ModelRunner<H>
where
    KvPool<S>: KvCache<B>,
{
    type Launched = Launched<B>;

    fn vocab_size(&self) -> usize {
        self.0.model().config().vocab_size
    }

    fn context_len(&self) -> Option<usize> {
        Some(self.0.model().config().max_position_embeddings)
    }

    fn launch(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
        fed: Option<&Launched<B>>,
    ) -> Result<Launched<B>, SchedError> {
        Ok(self.0.model().launch(kv, batch, fed)?)
    }

    fn finish(&mut self, step: Launched<B>) -> Result<ForwardOutput, SchedError> {
        Ok(self.0.model().finish(step)?)
    }

    fn feeds(&self, step: &Launched<B>) -> bool {
        self.0.model().feeds(step)
    }

    fn masks_picks(&self) -> bool {
        true
    }

    fn pick_masked(
        &mut self,
        step: &mut Launched<B>,
        masks: &[RowMask],
        fed: &[u32],
    ) -> Result<(), SchedError> {
        Ok(self.0.model().pick_masked(step, masks, fed)?)
    }

    fn verifies(&self) -> bool {
        true
    }

    fn verify(
        &mut self,
        kv: &mut KvPool<S>,
        rows: &[CheckRow],
    ) -> Result<Vec<CheckedRow>, SchedError> {
        let (checked, _) = check_runs(self.0.model(), kv, rows)?;
        Ok(checked)
    }
}

/// `rows` through `model` in one step, every row's token wanted (greedy, or drawn as its
/// draws ask): per row, its drafts and tokens, and the rows' final-normed states.
pub(crate) fn check_runs<B: Backend, K: KvCache<B>>(
    model: &Model<B>,
    kv: &mut K,
    rows: &[CheckRow],
) -> Result<(Vec<CheckedRow>, Option<B::Buffer>), SchedError> {
    let batch = ForwardBatch {
        embeds: Vec::new(),
        seqs: rows
            .iter()
            .map(|r| SeqChunk {
                request: r.request,
                tokens: r.tokens.clone(),
                start: r.start,
                logits: LogitsMode::All,
            })
            .collect(),
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: match rows.iter().any(|r| r.adapter != 0) {
            true => rows.iter().map(|r| r.adapter).collect(),
            false => Vec::new(),
        },
    };
    // The draws' and adjustments' rows, counted over the whole step; row j of a run
    // counts the j drafts before it as pending tokens.
    let mut draws = Vec::new();
    let mut masks = Vec::new();
    let mut batch = batch;
    let mut offset = 0;
    for r in rows {
        draws.extend(r.draws.iter().map(|d| RowDraw {
            row: offset + d.row,
            ..*d
        }));
        masks.extend(r.masks.iter().map(|m| RowMask {
            row: offset + m.row,
            allowed: m.allowed.clone(),
        }));
        for a in &r.adjust {
            let drafts = r.tokens.get(1..=a.row).ok_or_else(|| {
                SchedError::Other(format!(
                    "an adjustment of row {} of a run of {} tokens",
                    a.row,
                    r.tokens.len()
                ))
            })?;
            let mut pending = a.pending.clone();
            pending.extend_from_slice(drafts);
            batch.adjust.push(RowAdjust {
                row: offset + a.row,
                pending,
                ..a.clone()
            });
        }
        offset += r.tokens.len();
    }
    let choices = RowChoices {
        draws: &draws,
        masks: &masks,
    };
    let out = model.forward_picked_rows(kv, &batch, choices)?;
    let mut checked = Vec::with_capacity(rows.len());
    for (i, (r, picked)) in rows.iter().zip(out.tokens).enumerate() {
        if picked.len() != r.tokens.len() {
            return Err(SchedError::Other(format!(
                "the model checked {} of {} tokens",
                picked.len(),
                r.tokens.len()
            )));
        }
        checked.push(CheckedRow {
            drafts: r.tokens[1..].to_vec(),
            picked,
            logprobs: out.logprobs.get(i).cloned().unwrap_or_default(),
        });
    }
    Ok((checked, out.hidden))
}

/// A step model whose target model can be replaced between steps (a weight update: a model
/// of the same shapes with new weights).
pub trait SwapModel<B: Backend> {
    /// The target model.
    fn target_model(&self) -> &Arc<Model<B>>;
    /// Serves `model` from the next step on (a drafter's states from the old weights are
    /// dropped: its next round starts afresh).
    fn set_target_model(&mut self, model: Arc<Model<B>>);
}

impl<B: Backend> SwapModel<B> for ModelRunner<Arc<Model<B>>> {
    fn target_model(&self) -> &Arc<Model<B>> {
        &self.0
    }

    fn set_target_model(&mut self, model: Arc<Model<B>>) {
        self.0 = model;
    }
}
