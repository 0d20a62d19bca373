//! Overlapped decode steps: the next step is queued on the model before the current one is
//! read, its token ids taken from the current step's tokens (greedy or drawn) where they
//! were computed. The host's share of a step (reading tokens, stop checks, events, planning and
//! the next step's inputs) then runs while the device computes, not between its steps.
//!
//! The next step is planned before this one's tokens are known, so it assumes every
//! request goes on. A request that this step stops (an end-of-sequence id, a stop string)
//! has a row in the next step whose output is dropped, and its pages, released when it
//! finishes, are written by that row before any later step can reuse them (the device runs
//! steps in order). Requests this step stops by length are left out, so no row ever runs
//! past the context.

use strata_kv::KvStorage;
use strata_types::sampling::FED_TOKEN;
use strata_types::{ForwardBatch, SeqChunk};

use crate::{Scheduler, SeqId, StepModel};

/// A step queued on the model: its requests and token counts, in batch order, and the
/// rows (request, logits row) whose picks wait for grammar masks.
pub(crate) struct InFlight<L> {
    pub step: L,
    pub seqs: Vec<(SeqId, usize)>,
    pub masked: Vec<(SeqId, usize)>,
}

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Queues the decode step after `prev` (launched, not read): one token for each of its
    /// requests that is still running and not stopped by length, fed from `prev`'s
    /// tokens. `None` when this step should be planned the ordinary way instead:
    /// requests are waiting to be admitted, a running request is not in `prev` (it waits
    /// for a prefill chunk), `prev`'s tokens cannot feed a step, a speculative round may
    /// follow (`speculate.rs`), or the slots do not fit without preempting.
    pub(crate) fn launch_next(
        &mut self,
        prev: &InFlight<M::Launched>,
    ) -> Option<InFlight<M::Launched>> {
        if !self.config.overlap
            || !self.waiting.is_empty()
            || !self.model.feeds(&prev.step)
            || self.wants_round(true)
            || !self.adapters_fit_one_step()
        {
            return None;
        }
        let context_len = self.model.context_len();
        let mut rows = Vec::with_capacity(self.running.len());
        for seq in &self.running {
            // Both in id order (a batch lists its requests in running order).
            let row = prev
                .seqs
                .binary_search_by_key(&seq.id, |&(id, _)| id)
                .ok()?;
            let n = prev.seqs[row].1;
            if seq.computed + n != seq.tokens.len() {
                // `prev` did not reach the request's last token: no token to feed.
                return None;
            }
            // After `prev`, the request holds its tokens so far plus `prev`'s one.
            let len = seq.tokens.len() + 1;
            let ends =
                len - seq.prompt_len >= seq.req.max_tokens || context_len.is_some_and(|c| len >= c);
            if !ends {
                rows.push((seq.id, row, seq.computed + n));
            }
        }
        if rows.is_empty() {
            return None;
        }
        self.launch_fed(prev, rows)
    }

    /// Allocates a slot for each of `rows` (request, its row in `prev`, the position its
    /// token goes to) and queues the step; on any failure gives the slots back and
    /// returns `None`.
    fn launch_fed(
        &mut self,
        prev: &InFlight<M::Launched>,
        rows: Vec<(SeqId, usize, usize)>,
    ) -> Option<InFlight<M::Launched>> {
        let mut seqs = Vec::with_capacity(rows.len());
        let mut batch = ForwardBatch {
            embeds: Vec::new(),
            seqs: Vec::with_capacity(rows.len()),
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        let mut grown = Vec::with_capacity(rows.len());
        let mut masked = Vec::new();
        // A grammar's mask for this step needs `prev`'s token: the step's picks wait for
        // the masks, computed once `prev` is read (`step`), while this one runs.
        let takes_masks = self.model.masks_picks();
        let mut ok = true;
        for &(id, row, start) in &rows {
            let i = self.running.binary_search_by_key(&id, |s| s.id).ok()?;
            let kv = self.running[i]
                .kv
                .expect("running requests hold a pool request");
            // As an ordinary step's would, this may evict unused cached prefixes; it
            // never preempts (that waits for an ordinary step).
            match self.pool.extend(kv, 1) {
                Ok(r) => grown.push((kv, r.start)),
                Err(_) => {
                    ok = false;
                    break;
                }
            }
            if grown.last().is_some_and(|&(_, at)| at != start) {
                ok = false;
                break;
            }
            seqs.push((id, 1));
            let seq = &mut self.running[i];
            // This step computes the request's token number start + 1.
            let logits = match takes_masks && seq.masked_with_pick() {
                true => {
                    masked.push((id, batch.seqs.len()));
                    batch.masked.push(batch.seqs.len());
                    seq.pick_mode(start + 1)
                }
                false => seq.token_mode(start + 1),
            };
            if logits.picks() && seq.adjusts_with_pick() {
                // `prev`'s token, not yet read, counts for the penalties from the device.
                let at = batch.seqs.len();
                batch
                    .adjust
                    .extend(seq.logit_adjust_ahead(at, 1).map(|mut a| {
                        a.pending.push(FED_TOKEN | row as u32);
                        a
                    }));
            }
            batch.seqs.push(SeqChunk {
                request: kv,
                tokens: vec![FED_TOKEN | row as u32],
                start,
                logits,
            });
            batch.adapters.push(seq.req.adapter);
        }
        if ok {
            if let Ok(step) = self.model.launch(&mut self.pool, &batch, Some(&prev.step)) {
                self.overlapped_steps += 1;
                return Some(InFlight { step, seqs, masked });
            }
        }
        for (kv, len) in grown {
            let undone = self.pool.truncate(kv, len);
            debug_assert!(undone.is_ok(), "giving back a fed step's slot failed");
        }
        None
    }
}
