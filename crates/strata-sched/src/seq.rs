//! A request's state inside the scheduler, across admissions and preemptions.

use std::borrow::Cow;

use strata_kv::RequestId;
use strata_types::sampling::{draw_uniform, RowAdjust, TokenCounts, MAX_TOP_LOGPROBS};
use strata_types::LogitsMode;

use crate::{FinishReason, Request, SeqId};

pub(crate) struct Seq {
    pub id: SeqId,
    /// Settings and stop conditions; its `prompt` has moved into `tokens`.
    pub req: Request,
    /// The prompt, then every generated token. After a preemption the whole of it is
    /// recomputed, but only tokens sampled later are reported.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The seed of the request's draws: token `i` is drawn with `draw_uniform(seed, i)`, so
    /// its output depends on neither what it was batched with nor preemptions.
    pub seed: u64,
    /// The pool request while running.
    pub kv: Option<RequestId>,
    /// Tokens whose K/V is in the pool and committed.
    pub computed: usize,
    /// Tokens of this admission held by the prefix cache (pinned for us).
    pub pinned: usize,
    /// Whether this admission's prefill is done (and its prefix handed to the cache).
    pub prefilled: bool,
    /// Prompt tokens reused from the cache at the first admission; `None` until admitted.
    pub cached_tokens: Option<usize>,
    /// Tokens scheduled for the forward pass being built (from `computed`).
    pub chunk: Option<usize>,
    /// Set once the request ran out of pages while running alone. It was restarted on an
    /// empty cache and from then on stays out of the cache (what it would cache, it would
    /// also pin); a second time means it cannot fit.
    pub restarted_alone: bool,
    /// How its drafts fare, and whether it drafts now (speculative rounds).
    pub pace: DraftPace,
    /// Prompt positions below this have had their logprobs reported (requests with
    /// `prompt_logprobs`; position 0 has none). Kept across preemptions, so a recomputed
    /// prompt reports nothing twice.
    pub prompt_scored: usize,
    /// Its tokens counted for the penalties (kept only for a request with logit controls).
    pub counts: TokenCounts,
    /// Another sample of the same prompt, submitted before it
    /// ([`Scheduler::submit_sibling`](crate::Scheduler::submit_sibling)): this one is first
    /// admitted only once that one's prompt is in the prefix cache, so it reuses the
    /// prompt's whole pages instead of computing them again.
    pub follows: Option<SeqId>,
}

/// Bytes of logits rows a prompt-scoring chunk may return: its chunk is cut so that its
/// `rows x vocab` f32 values stay within this (at Gemma's 262,144 ids, 64 rows).
const PROMPT_SCORE_BYTES: usize = 64 << 20;

/// Drafting that does not pay is paused: a request whose recent drafts the target mostly
/// rejects costs a verification step a round for nothing, so it decodes plainly for a
/// while (twice as long each time it fails again), then tries one drafted round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DraftPace {
    /// Moving average of the share of drafts kept (half weight on the latest round).
    rate: f32,
    /// Completion length from which the request drafts again.
    resume_at: usize,
    /// Tokens of the next pause.
    backoff: usize,
}

/// Below this share of drafts kept, a round costs more than the tokens it yields (a
/// round of 3 drafts breaks even at 0.57 kept drafts on E2B, 0.40 on E4B, on an H200:
/// `docs/speculative.md`).
const MIN_KEPT_SHARE: f32 = 0.2;
/// The first pause, in tokens; each failed retry doubles it up to `MAX_PAUSE`.
const FIRST_PAUSE: usize = 16;
const MAX_PAUSE: usize = 256;

impl Default for DraftPace {
    fn default() -> Self {
        Self {
            // Optimistic: a request drafts from its first round.
            rate: 1.0,
            resume_at: 0,
            backoff: FIRST_PAUSE,
        }
    }
}

impl DraftPace {
    /// Whether a request with `completion` tokens so far drafts in the next round.
    pub fn drafts_at(&self, completion: usize) -> bool {
        completion >= self.resume_at
    }

    /// Records a round that drafted `drafted` tokens (more than 0) and kept `kept`, the
    /// request having `completion` tokens after it.
    pub fn record(&mut self, kept: usize, drafted: usize, completion: usize) {
        let share = kept as f32 / drafted as f32;
        self.rate = 0.5 * self.rate + 0.5 * share;
        if self.rate >= MIN_KEPT_SHARE {
            if share >= MIN_KEPT_SHARE {
                self.backoff = FIRST_PAUSE;
            }
            return;
        }
        self.resume_at = completion + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_PAUSE);
        // The retry starts just above the line: one more bad round pauses again.
        self.rate = 1.5 * MIN_KEPT_SHARE;
    }
}

impl Seq {
    pub fn new(id: SeqId, mut req: Request, seed: u64) -> Self {
        let tokens = std::mem::take(&mut req.prompt);
        Self {
            id,
            prompt_len: tokens.len(),
            tokens,
            req,
            seed,
            kv: None,
            computed: 0,
            pinned: 0,
            prefilled: false,
            cached_tokens: None,
            chunk: None,
            restarted_alone: false,
            pace: DraftPace::default(),
            prompt_scored: 1,
            counts: TokenCounts::default(),
            follows: None,
        }
    }

    /// Whether prompt tokens remain whose logprobs the request asked for.
    pub fn scores_prompt(&self) -> bool {
        self.req.prompt_logprobs.is_some() && self.prompt_scored < self.prompt_len
    }

    /// The most tokens to compute in one chunk: `chunk`, or fewer for a prompt-scoring
    /// request, whose chunk returns a row of `vocab` logits per token.
    pub fn chunk_cap(&self, chunk: usize, vocab: usize) -> usize {
        if self.scores_prompt() {
            chunk.min((PROMPT_SCORE_BYTES / (vocab.max(1) * 4)).max(1))
        } else {
            chunk
        }
    }

    /// The prompt positions whose logprobs a chunk of `n` tokens from `start` yields (row
    /// `j` predicts token `start + j + 1`), not yet reported.
    pub fn scored_by(&self, start: usize, n: usize) -> std::ops::Range<usize> {
        if self.req.prompt_logprobs.is_none() {
            return 0..0;
        }
        let from = self.prompt_scored.max(start + 1);
        from..(start + n + 1).min(self.prompt_len).max(from)
    }

    /// What a step computing this request's last token up to position `index` asks of the
    /// model: only the greedy token, or a token drawn where the logits are (the draw of token
    /// `index`), with its logprobs when the request wants them; the logits themselves only
    /// for more top logprobs than a backend reports, for a constraint's mask, or for logit
    /// controls (bias, penalties, `min_tokens`) with logprobs, which stay the raw
    /// distribution's. Controls without logprobs go with the pick
    /// ([`Seq::adjusts_with_pick`]).
    pub fn token_mode(&self, index: usize) -> LogitsMode {
        if self.req.constraint.is_some()
            || (!self.req.controls.is_neutral() && self.req.logprobs.is_some())
        {
            // Masks, and controls beside logprobs, are applied on the host, to the logits
            // (a model that takes masks gets them after the launch: `pick_mode`).
            return LogitsMode::Last;
        }
        self.pick_mode(index)
    }

    /// The pick of token `index` where the logits are (greedy, or drawn with its uniform),
    /// whatever masks or adjustments come before it.
    pub fn pick_mode(&self, index: usize) -> LogitsMode {
        let sampling = &self.req.sampling;
        match self.req.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => LogitsMode::Last,
            None if sampling.is_greedy() => LogitsMode::Argmax,
            logprobs => LogitsMode::Draw {
                params: *sampling,
                uniform: draw_uniform(self.seed, index as u64),
                logprobs,
            },
        }
    }

    /// Whether this request's logit controls are applied where the logits are, right
    /// before the model picks its token (`ForwardBatch::adjust`): controls with no
    /// logprobs, when the model picks the token.
    pub fn adjusts_with_pick(&self) -> bool {
        !self.req.controls.is_neutral() && self.req.logprobs.is_none()
    }

    /// Whether a model that takes grammar masks picks this request's token: a constraint
    /// and no logprobs (which stay the raw row's, so the draw is then the host's).
    pub fn masked_with_pick(&self) -> bool {
        self.req.constraint.is_some() && self.req.logprobs.is_none()
    }

    /// The logit adjustment of this request's next draw (`None` when its controls are
    /// neutral), its token counts first brought up to date.
    pub fn logit_adjust(&mut self) -> Option<RowAdjust> {
        self.logit_adjust_ahead(0, 0)
    }

    /// The logit adjustment, at logits row `row`, of the draw `ahead` tokens past this
    /// request's known ones: a step queued before the host read the tokens in between,
    /// which the caller lists as pending (they count for `min_tokens` here).
    pub fn logit_adjust_ahead(&mut self, row: usize, ahead: usize) -> Option<RowAdjust> {
        let controls = &self.req.controls;
        if controls.is_neutral() {
            return None;
        }
        self.counts.update(&self.tokens, self.prompt_len);
        // `min_tokens` holds back every id that would end the request.
        let mut end_ids = self.req.stop_token_ids.clone();
        if !self.req.ignore_eos {
            end_ids.extend_from_slice(&self.req.stop_ids);
        }
        let completion = self.tokens.len() - self.prompt_len + ahead;
        Some(self.counts.row_adjust(row, controls, completion, &end_ids))
    }

    /// The prefix cache's key for the first `len` tokens: the tokens themselves, or for a
    /// request with a LoRA adapter each with the adapter's id above bit 24, so that K/V
    /// computed under one adapter is never reused under another or the base model.
    /// A media run's rows are keyed by its content ([`MediaInput::row_key`]), not by their
    /// placeholder ids.
    ///
    /// [`MediaInput::row_key`]: crate::MediaInput
    pub fn cache_key(&self, len: usize) -> Cow<'_, [u32]> {
        let tokens = &self.tokens[..len];
        if self.req.adapter == 0 && self.req.media.iter().all(|m| m.start >= len) {
            return Cow::Borrowed(tokens);
        }
        let mut key: Vec<u32> = tokens.to_vec();
        for m in &self.req.media {
            for i in 0..m.rows.min(len.saturating_sub(m.start)) {
                key[m.start + i] = m.row_key(i);
            }
        }
        let a = self.req.adapter;
        if a != 0 {
            key.iter_mut().for_each(|t| *t |= a << 24);
        }
        Cow::Owned(key)
    }

    pub fn completion(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens still to compute; at least 1 while running (the last sampled token, or the
    /// rest of the prompt).
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Back to the waiting state, keeping every token and the sampler's position.
    pub fn reset_for_requeue(&mut self) {
        self.kv = None;
        self.computed = 0;
        self.pinned = 0;
        self.prefilled = false;
        self.chunk = None;
    }

    /// Why the request ends after the token just appended, if it does.
    pub fn stop_reason(&mut self, context_len: Option<usize>) -> Option<FinishReason> {
        let last = *self.tokens.last()?;
        if !self.req.ignore_eos && self.req.stop_ids.contains(&last) {
            return Some(FinishReason::Stop);
        }
        if self.req.stop_token_ids.contains(&last) {
            return Some(FinishReason::Stop);
        }
        let completion = &self.tokens[self.prompt_len..];
        if self
            .req
            .stop_sequences
            .iter()
            .any(|s| !s.is_empty() && completion.ends_with(s))
        {
            return Some(FinishReason::Stop);
        }
        if let Some(f) = &mut self.req.stop_fn {
            if f(completion) {
                return Some(FinishReason::Stop);
            }
        }
        if completion.len() >= self.req.max_tokens {
            return Some(FinishReason::Length);
        }
        // The next step would compute position `tokens.len() - 1`; a sequence as long as
        // the context has no room for another token.
        if context_len.is_some_and(|c| self.tokens.len() >= c) {
            return Some(FinishReason::Length);
        }
        None
    }
}
