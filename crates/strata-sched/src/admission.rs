//! Moving requests from the waiting queue into the running set.

use strata_kv::{KvStorage, PoolKind};
use strata_types::sampling::sample;

use crate::seq::Seq;
use crate::{Scheduler, StepModel};

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Why `seq` can never run, checked at its first admission.
    pub(crate) fn refusal(&self, seq: &Seq) -> Option<String> {
        let prompt = &seq.tokens[..seq.prompt_len];
        if prompt.is_empty() {
            return Some("the prompt has no tokens".into());
        }
        let vocab = self.model.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Some(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            ));
        }
        if seq.req.adapter >= crate::MAX_ADAPTER_ID || (seq.req.adapter != 0 && vocab > 1 << 24) {
            return Some(format!(
                "adapter id {} is past {} (or the vocabulary past 2^24 ids)",
                seq.req.adapter,
                crate::MAX_ADAPTER_ID - 1
            ));
        }
        let mut end = 0;
        for (i, m) in seq.req.media.iter().enumerate() {
            let fits = m.rows > 0
                && m.start >= end
                && m.start + m.rows <= seq.prompt_len
                && m.values.len() % m.rows == 0
                && !m.values.is_empty();
            if !fits {
                return Some(format!(
                    "media input {i} ({} rows at {} of a {}-token prompt, {} values) is                      outside the prompt, overlaps another or is not whole rows",
                    m.rows,
                    m.start,
                    seq.prompt_len,
                    m.values.len()
                ));
            }
            end = m.start + m.rows;
        }
        if !seq.req.media.is_empty() && vocab >= 1 << 23 {
            return Some("media inputs need a vocabulary below 2^23 ids".into());
        }
        let ctx = self.model.context_len();
        if let Some(ctx) = ctx.filter(|&c| prompt.len() >= c) {
            return Some(format!(
                "the prompt ({} tokens) does not fit the model's context of {ctx}",
                prompt.len()
            ));
        }
        // `sample` is the one definition of valid settings.
        if let Err(e) = sample(&[0.0], &seq.req.sampling, 0) {
            return Some(e.to_string());
        }
        let longest = ctx
            .unwrap_or(usize::MAX)
            .min(seq.prompt_len.saturating_add(seq.req.max_tokens));
        let plan = self.pool.plan();
        let pages = longest.div_ceil(plan.page_size);
        if pages > plan.full {
            return Some(format!(
                "prompt + max_tokens ({longest} tokens, {pages} pages) exceed the KV pool's \
                 {} pages of {} tokens",
                plan.full, plan.page_size
            ));
        }
        None
    }

    /// Whether the pool can probably take `seq` now: pages for the rest of its prompt plus
    /// one page of growth per running request, counting evictable pages as free (cached
    /// prefixes, idle window pages: the pool evicts them on demand). A guess erring towards
    /// admitting: preemption corrects it.
    pub(crate) fn fits_now(&self, seq: &Seq) -> bool {
        if self.running.is_empty() {
            return true;
        }
        let ps = self.pool.page_size();
        let matched = if seq.scores_prompt() {
            0
        } else {
            self.pool.match_prefix(&seq.cache_key(seq.tokens.len() - 1))
        };
        let need = seq.tokens.len().div_ceil(ps) - matched / ps;
        let headroom = self.running.len();
        // Pages running requests pin in the cache cannot be evicted; the largest pin is a
        // lower bound on them (requests often share one system prompt).
        let pinned = self
            .running
            .iter()
            .map(|s| s.pinned / ps)
            .max()
            .unwrap_or(0);
        let status = self.pool.status();
        let available = |kind: PoolKind| {
            status
                .pools
                .iter()
                .find(|p| p.pool == kind)
                .map(|p| p.pages_free + p.pages_evictable)
        };
        let full = available(PoolKind::Full)
            .unwrap_or(0)
            .saturating_sub(pinned);
        if full < need + headroom {
            return false;
        }
        match (available(PoolKind::Window), self.pool.layout().window()) {
            (Some(window_pages), Some(w)) => {
                // A request reads window pages only for its last `w` positions plus the
                // chunk being computed, and at admission the `w` before its cached prefix's
                // end (idle pages it takes out of the evictable count).
                let own = need.min((w + self.config.prefill_chunk).div_ceil(ps) + 1);
                let need_w = own + if self.caching() { w.div_ceil(ps) } else { 0 };
                window_pages >= need_w + headroom
            }
            _ => true,
        }
    }

    /// Gives `seq` a pool request with the longest usable cached prefix of its tokens
    /// (all but the last, which must be computed for logits) and puts it in the running
    /// set; returns its index there.
    pub(crate) fn admit(&mut self, mut seq: Seq) -> usize {
        let kv = self.pool.alloc_request();
        // A prompt-scoring request needs the logits of every prompt position, which a cached
        // prefix does not keep.
        let matched = if seq.restarted_alone || seq.scores_prompt() {
            0
        } else {
            let reusable = seq.cache_key(seq.tokens.len() - 1);
            // A fresh request holds no tokens, so reuse cannot be refused.
            self.pool.reuse_prefix(kv, &reusable).unwrap_or(0)
        };
        seq.kv = Some(kv);
        seq.computed = matched;
        seq.pinned = matched;
        seq.prefilled = false;
        seq.chunk = None;
        seq.cached_tokens.get_or_insert(matched);
        let at = self.running.partition_point(|s| s.id < seq.id);
        self.running.insert(at, seq);
        at
    }
}
