//! A forward step split in two: [`Model::launch`] queues it, [`Model::finish`] reads its
//! output. Between the two the host can queue the next decode step, whose token ids take
//! this step's tokens (greedy or drawn) on the backend ([`FED_TOKEN`] marks), so a GPU runs
//! step after step without waiting for the host to read each one's tokens and build the
//! next.

use strata_kernels::sampling::{RowAdjust, RowMask, FED_TOKEN};
use strata_kernels::Backend;

use crate::batch::{ForwardBatch, ForwardOutput};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::model::Model;

/// A step queued by [`Model::launch`], read by [`Model::finish`].
pub struct Launched<B: Backend>(State<B>);

enum State<B: Backend> {
    /// The output, already on the host (steps that want logits).
    Done(ForwardOutput),
    /// Every sequence wanted only a token (greedy or drawn): one id a sequence, in batch
    /// order, still where the logits were, on its way to the host.
    Picked {
        tokens: B::Tokens,
        vocab: usize,
        rows: usize,
    },
    /// Rows wait for grammar masks (`ForwardBatch::masked`): the step's wanted logits
    /// rows (`counts` a sequence), still raw, until [`Model::pick_masked`].
    Held {
        logits: Option<B::Buffer>,
        counts: Vec<usize>,
        batch: ForwardBatch,
    },
}

impl<B: Backend> Launched<B> {
    pub(crate) fn done(out: ForwardOutput) -> Self {
        Self(State::Done(out))
    }

    pub(crate) fn picked(tokens: B::Tokens, vocab: usize, rows: usize) -> Self {
        Self(State::Picked {
            tokens,
            vocab,
            rows,
        })
    }

    pub(crate) fn held(
        logits: Option<B::Buffer>,
        counts: Vec<usize>,
        batch: &ForwardBatch,
    ) -> Self {
        Self(State::Held {
            logits,
            counts,
            batch: batch.clone(),
        })
    }

    /// The ids on the backend and their count, when this step left them there.
    fn picked_tokens(&self) -> Option<(&B::Tokens, usize)> {
        match &self.0 {
            State::Picked { tokens, rows, .. } => Some((tokens, *rows)),
            State::Done(_) | State::Held { .. } => None,
        }
    }
}

/// Replaces each pending `FED_TOKEN | r` of `adjust` with `fed[r]`.
fn resolve_fed(adjust: &mut [RowAdjust], fed: &[u32]) -> Result<()> {
    for t in adjust.iter_mut().flat_map(|a| a.pending.iter_mut()) {
        if *t & FED_TOKEN != 0 {
            let r = (*t & !FED_TOKEN) as usize;
            *t = *fed.get(r).ok_or_else(|| {
                ModelError::Invalid(format!(
                    "an adjustment counts row {r} of a feeding step of {} ids",
                    fed.len()
                ))
            })?;
        }
    }
    Ok(())
}

/// Whether a step's output can stay on the backend as ids: every sequence wants only a
/// token (greedy or drawn).
pub(crate) fn all_picked(batch: &ForwardBatch) -> bool {
    !batch.seqs.is_empty() && batch.seqs.iter().all(|s| s.logits.picks())
}

/// Checks the [`FED_TOKEN`] marks of `batch` against the step they read from: there must
/// be one, it must have left its tokens on the backend, and each mark must name one of its
/// sequences. Returns whether any token is marked.
pub(crate) fn check_fed(batch: &ForwardBatch, fed_rows: Option<usize>) -> Result<bool> {
    let mut any = false;
    for &t in batch.seqs.iter().flat_map(|s| &s.tokens) {
        if t & FED_TOKEN == 0 {
            continue;
        }
        any = true;
        let row = (t & !FED_TOKEN) as usize;
        match fed_rows {
            None => {
                return Err(ModelError::Invalid(format!(
                    "token {t:#x} reads a token of an earlier step, but no step that kept its tokens was given"
                )))
            }
            Some(n) if row >= n => {
                return Err(ModelError::Invalid(format!(
                    "token {t:#x} reads sequence {row} of a step of {n}"
                )))
            }
            Some(_) => {}
        }
    }
    Ok(any)
}

impl<B: Backend> Model<B> {
    /// Queues `batch` and returns without reading its output (which [`Model::finish`]
    /// does). A token id `FED_TOKEN | i` stands for the token of sequence `i` of
    /// `fed`, a step launched before this one and not yet finished that can feed it
    /// ([`Model::feeds`]); the backend substitutes it before the step runs.
    pub fn launch<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
        fed: Option<&Launched<B>>,
    ) -> Result<Launched<B>> {
        let source = fed.and_then(Launched::picked_tokens);
        let marked = check_fed(batch, source.map(|(_, rows)| rows))?;
        if marked && self.has_host_tables() {
            return Err(ModelError::Invalid(
                "a model with host-resident lookup tables needs every token id on the host".into(),
            ));
        }
        self.launch_checked(kv, batch, source.filter(|_| marked).map(|(t, _)| t))
    }

    /// Whether a later [`Model::launch`] can take `step`'s tokens as `fed`: every sequence
    /// of it wanted only a token (greedy or drawn), and this model reads its lookup tables
    /// on the backend (a table in host memory is read with the host's ids).
    pub fn feeds(&self, step: &Launched<B>) -> bool {
        matches!(step.0, State::Picked { .. }) && !self.has_host_tables()
    }

    /// Queues the picks of a step whose rows waited for grammar masks
    /// (`ForwardBatch::masked`), each of those rows masked by its entry of `masks` (after
    /// the softcap and the batch's adjustments, as the host path orders them). `fed` holds
    /// the ids of the step this one was fed from, by sequence, as the caller read them:
    /// that step is gone, so its `FED_TOKEN | r` marks in the adjustments take `fed[r]`.
    pub fn pick_masked(
        &self,
        step: &mut Launched<B>,
        masks: &[RowMask],
        fed: &[u32],
    ) -> Result<()> {
        let State::Held {
            logits,
            counts,
            mut batch,
        } = std::mem::replace(&mut step.0, State::Done(ForwardOutput::empty(0, 0)))
        else {
            return Err(ModelError::Invalid(
                "this step holds no rows for masks".into(),
            ));
        };
        let mut rows: Vec<usize> = masks.iter().map(|m| m.row).collect();
        rows.sort_unstable();
        let mut want = batch.masked.clone();
        want.sort_unstable();
        if rows != want {
            return Err(ModelError::Invalid(format!(
                "masks for rows {rows:?}, but rows {want:?} wait for them"
            )));
        }
        resolve_fed(&mut batch.adjust, fed)?;
        *step = match (logits, all_picked(&batch)) {
            (Some(mut l), true) => self.start_picks_masked(&mut l, &batch, None, masks)?,
            (logits, _) => {
                Launched::done(self.download_masked(logits, &counts, &batch, None, masks)?)
            }
        };
        Ok(())
    }

    /// Reads a launched step's output (waiting for it).
    pub fn finish(&self, step: Launched<B>) -> Result<ForwardOutput> {
        match step.0 {
            State::Done(out) => Ok(out),
            State::Held { .. } => Err(ModelError::Invalid(
                "a step whose rows wait for grammar masks was read before they came".into(),
            )),
            State::Picked { tokens, vocab, .. } => {
                let picks = self.backend.pick_finish(tokens)?;
                let mut out = ForwardOutput::empty(vocab, picks.len());
                for (i, p) in picks.into_iter().enumerate() {
                    out.tokens[i] = Some(p.id);
                    out.logprobs[i] = p.logprobs;
                }
                Ok(out)
            }
        }
    }
}
