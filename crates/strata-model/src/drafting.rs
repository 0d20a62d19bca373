//! A target model with its assistant (the drafter of speculative decoding) behind one
//! [`StepModel`]: ordinary steps go to the target; speculative rounds draft with the
//! assistant from the target's final-normed state of the row that produced each request's
//! newest token, then check the drafts in one target step.

use std::collections::HashMap;
use std::sync::Arc;

use strata_kernels::sampling::RowMask;
use strata_kernels::{Backend, StridedCopy};
use strata_kv::{KvPool, KvStorage, RequestId};
use strata_sched::{CheckRow, CheckedRow, DraftMasks, DraftRow, SchedError, StepModel};

use crate::runner::{check_runs, ModelHandle, ModelRunner};
use crate::{Assistant, DraftSeq, ForwardBatch, ForwardOutput, KvCache, Launched, ModelError};

/// The target's state a request drafts from next: row `row` of `rows`, computed by the
/// round that left the request's newest token at position `next`.
struct Kept<B: Backend> {
    next: usize,
    rows: Arc<B::Buffer>,
    row: usize,
}

/// A target model (`H`) that drafts with `assistant`, `draft_tokens` tokens a round.
pub struct Drafting<H: ModelHandle> {
    target: ModelRunner<H>,
    assistant: Arc<Assistant<H::Backend>>,
    draft_tokens: usize,
    /// Per request, the state of its latest round (only the latest round's requests).
    kept: HashMap<RequestId, Kept<H::Backend>>,
}

impl<H: ModelHandle> Drafting<H> {
    /// `assistant` must have been loaded for `target`'s configuration
    /// ([`Assistant::load`] checks that).
    pub fn new(target: H, assistant: Arc<Assistant<H::Backend>>, draft_tokens: usize) -> Self {
        Self {
            target: ModelRunner(target),
            assistant,
            draft_tokens,
            kept: HashMap::new(),
        }
    }

    /// The target model.
    pub fn target(&self) -> &H {
        &self.target.0
    }

    /// The drafts of `rows` (by row), one assistant round for each distinct draft count.
    fn drafts<K: KvCache<H::Backend>>(
        &self,
        kv: &mut K,
        rows: &[DraftRow],
    ) -> Result<Vec<Vec<u32>>, SchedError> {
        let target = self.target.0.model();
        let b = target.backend();
        let h = target.config().hidden_size;
        let mut drafts = vec![Vec::new(); rows.len()];
        let mut counts: Vec<usize> = rows.iter().map(|r| r.drafts).filter(|&d| d > 0).collect();
        counts.sort_unstable();
        counts.dedup();
        for n in counts {
            let members: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].drafts == n).collect();
            let mut hidden = b
                .scratch(members.len() * h, b.activation_dtype())
                .map_err(ModelError::from)?;
            for (j, &i) in members.iter().enumerate() {
                let r = &rows[i];
                let kept = self
                    .kept
                    .get(&r.request)
                    .filter(|k| k.next == r.start)
                    .ok_or_else(|| {
                        SchedError::Other(format!(
                            "no drafter state for request {:?} at position {}",
                            r.request, r.start
                        ))
                    })?;
                b.copy_strided(
                    &kept.rows,
                    &mut hidden,
                    StridedCopy {
                        rows: 1,
                        cols: h,
                        src_offset: kept.row * h,
                        src_stride: h,
                        dst_offset: j * h,
                        dst_stride: h,
                    },
                )
                .map_err(ModelError::from)?;
            }
            let seqs: Vec<DraftSeq> = members
                .iter()
                .map(|&i| DraftSeq {
                    request: rows[i].request,
                    position: rows[i].start,
                })
                .collect();
            let tokens: Vec<u32> = members.iter().map(|&i| rows[i].token).collect();
            let round = self
                .assistant
                .draft(target, kv, &seqs, &tokens, &hidden, n)?;
            for step in round {
                for (j, &i) in members.iter().enumerate() {
                    drafts[i].push(step[j]);
                }
            }
        }
        Ok(drafts)
    }
}

/// Everything but the rounds is the target's own `StepModel` (`model.rs`).
impl<B: Backend, S: KvStorage, H: ModelHandle<Backend = B>> StepModel<S> for Drafting<H>
where
    KvPool<S>: KvCache<B>,
{
    type Launched = Launched<B>;

    fn vocab_size(&self) -> usize {
        StepModel::<S>::vocab_size(&self.target)
    }

    fn context_len(&self) -> Option<usize> {
        StepModel::<S>::context_len(&self.target)
    }

    fn launch(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
        fed: Option<&Launched<B>>,
    ) -> Result<Launched<B>, SchedError> {
        self.target.launch(kv, batch, fed)
    }

    fn finish(&mut self, step: Launched<B>) -> Result<ForwardOutput, SchedError> {
        StepModel::<S>::finish(&mut self.target, step)
    }

    fn feeds(&self, step: &Launched<B>) -> bool {
        StepModel::<S>::feeds(&self.target, step)
    }

    fn masks_picks(&self) -> bool {
        StepModel::<S>::masks_picks(&self.target)
    }

    fn pick_masked(
        &mut self,
        step: &mut Launched<B>,
        masks: &[RowMask],
        fed: &[u32],
    ) -> Result<(), SchedError> {
        StepModel::<S>::pick_masked(&mut self.target, step, masks, fed)
    }

    fn draft_tokens(&self) -> usize {
        self.draft_tokens
    }

    fn verifies(&self) -> bool {
        StepModel::<S>::verifies(&self.target)
    }

    fn verify(
        &mut self,
        kv: &mut KvPool<S>,
        rows: &[CheckRow],
    ) -> Result<Vec<CheckedRow>, SchedError> {
        self.target.verify(kv, rows)
    }

    fn can_draft(&self, request: RequestId, position: usize) -> bool {
        self.kept.get(&request).is_some_and(|k| k.next == position)
    }

    fn speculate(
        &mut self,
        kv: &mut KvPool<S>,
        rows: &[DraftRow],
        masks: &mut DraftMasks,
    ) -> Result<Vec<CheckedRow>, SchedError> {
        let drafts = self.drafts(kv, rows)?;
        let mut runs = Vec::with_capacity(rows.len());
        for (i, (r, d)) in rows.iter().zip(drafts).enumerate() {
            runs.push(CheckRow {
                request: r.request,
                start: r.start,
                masks: masks(i, &d).map_err(SchedError::Other)?,
                tokens: std::iter::once(r.token).chain(d).collect(),
                draws: r.draws.clone(),
                adjust: r.adjust.clone(),
                adapter: r.adapter,
            });
        }
        let (checked, hidden) = check_runs(self.target.0.model(), kv, &runs)?;
        let hidden =
            hidden.ok_or_else(|| SchedError::Other("the target returned no hidden rows".into()))?;
        let hidden = Arc::new(hidden);
        self.kept.clear();
        let mut offset = 0;
        for (r, row) in rows.iter().zip(&checked) {
            let agreed = row.agreed();
            self.kept.insert(
                r.request,
                Kept {
                    next: r.start + agreed + 1,
                    rows: hidden.clone(),
                    row: offset + agreed,
                },
            );
            offset += row.picked.len();
        }
        Ok(checked)
    }
}

impl<B: Backend> crate::runner::SwapModel<B> for Drafting<Arc<crate::Model<B>>> {
    fn target_model(&self) -> &Arc<crate::Model<B>> {
        &self.target.0
    }

    fn set_target_model(&mut self, model: Arc<crate::Model<B>>) {
        self.target.0 = model;
        self.kept.clear();
    }
}
