//! A step that returns the greedy token of every wanted row and keeps those rows' hidden
//! states: what speculative decoding needs from the target (the verification of a run of
//! drafts, and the state the drafter starts from).

use strata_kernels::Backend;

use crate::batch::{ForwardBatch, LogitsMode};
use crate::error::{ModelError, Result};
use crate::forward::{HiddenOut, StepInputs};
use crate::kv_cache::KvCache;
use crate::model::Model;

/// What [`Model::forward_greedy_rows`] returns.
pub struct GreedyRows<B: Backend> {
    /// Per sequence, the greedy token (argmax of the softcapped logits, ties to the lowest
    /// id) of each row it asked for: one for `Last`, one a token for `All`, none for `None`.
    pub tokens: Vec<Vec<u32>>,
    /// Those rows under the final norm (what the output projection reads), `[rows, hidden]`
    /// in the order of `tokens` flattened; `None` when no row was asked for.
    pub hidden: Option<B::Buffer>,
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
        if let Some(rows) = kv.replay_rows(self, batch, &prep)? {
            return Ok(rows);
        }
        kv.begin_step(b, batch)?;
        let inputs = StepInputs {
            ids: b.upload_index(&prep.ids)?,
            positions: b.upload_index(&prep.positions)?,
        };
        let mut hidden = None;
        let (logits, counts) = self.run(
            kv,
            batch,
            &prep,
            &inputs,
            None,
            Some(HiddenOut::Keep(&mut hidden)),
        )?;
        let rows: usize = counts.iter().sum();
        let ids = match &logits {
            Some(l) => b.argmax_rows(l, self.config.vocab_size, rows, self.final_softcap())?,
            None => vec![],
        };
        let mut at = 0;
        let tokens = counts
            .iter()
            .map(|&k| {
                at += k;
                ids[at - k..at].to_vec()
            })
            .collect();
        Ok(GreedyRows { tokens, hidden })
    }
}
