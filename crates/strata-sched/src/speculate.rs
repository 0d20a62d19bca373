//! Speculative rounds: while few requests run and the model picks all their tokens, a step
//! drafts a few tokens for each (with the model's drafter, or by prompt lookup in the
//! request's own tokens, `lookup.rs`) and checks them all in one target step. Each request
//! keeps the drafts that equal the target's own choices (greedy, or drawn with the uniform
//! plain decoding would use for that token) and the target's token after them, so its
//! output is exactly what plain decoding gives, seeded draws included; the drafts only
//! decide how many tokens a step yields.

use std::collections::HashMap;
use std::time::Instant;

use strata_kv::KvStorage;
use strata_types::sampling::{RowDraw, RowMask};
use strata_types::LogitsMode;

use crate::reserve::Reserved;
use crate::seq::Seq;
use crate::{
    CheckRow, CheckedRow, DraftRow, Event, EventKind, FinishReason, LaunchShape, MaskStats,
    PromptLookup, Scheduler, SeqId, StepModel,
};

/// One request's drafts in a planned round: how many, the tokens themselves when the
/// scheduler makes them (prompt lookup), and whether the round counts towards its pace.
struct Planned {
    drafts: usize,
    tokens: Vec<u32>,
    paced: bool,
}

/// How the drafts fared since the start (`/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Speculative rounds run (target steps that checked drafts, or kept the drafter's
    /// state for the next round).
    pub rounds: u64,
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens the target agreed with.
    pub accepted: u64,
}

impl DraftStats {
    /// Tokens a round yields on average (kept drafts plus the target's own).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }
}

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Whether the next step should be a speculative round: drafts come from the model or
    /// from prompt lookup, nothing waits, at most `draft_max_requests` run, every one of
    /// them is decoding with tokens the model picks, and at least one is not pausing its
    /// drafts (and, for prompt lookup, has a match to propose). With `lagging`, the
    /// requests' newest tokens are still being computed (a step is queued): a lookup then
    /// counts as a match if one more token could make it.
    pub(crate) fn wants_round(&self, lagging: bool) -> bool {
        let model_drafts = self.model.draft_tokens() > 0;
        let lookup = self.config.prompt_lookup;
        (model_drafts || lookup.is_some())
            && self.waiting.is_empty()
            && !self.running.is_empty()
            && self.running.len() <= self.config.draft_max_requests
            // A round runs every request in one step: their adapters must fit it.
            && self.adapters_fit_one_step()
            && self.running.iter().all(|s| {
                // Tokens the model picks (greedy or drawn, with their logprobs; under a
                // grammar, once the caller's masks arrive): not a request drawn on the
                // host for more top logprobs than a backend reports.
                let masked = s.masked_with_pick() && self.model.masks_picks();
                s.pending() == 1 && (masked || s.token_mode(s.tokens.len()) != LogitsMode::Last)
            })
            && self.running.iter().any(|s| {
                let matches = |l: PromptLookup| match lagging {
                    true => l.may_propose(&s.tokens),
                    false => !l.propose(&s.tokens, 1).is_empty(),
                };
                s.pace.drafts_at(s.completion().len())
                    && (model_drafts || lookup.is_some_and(matches))
            })
    }

    /// Runs one speculative round over every running request (`wants_round` holds).
    pub(crate) fn round(&mut self, events: &mut Vec<Event>) {
        let planned = self.plan_drafts();
        let mut i = 0;
        while i < self.running.len() {
            let want = 1 + planned.get(&self.running[i].id).map_or(0, |p| p.drafts);
            match self.reserve(i, want, events) {
                Reserved::Removed => continue,
                Reserved::Tokens(_) | Reserved::Skipped => i += 1,
            }
        }
        let mut seqs = Vec::new();
        let mut rows = Vec::new();
        let mut paced = Vec::new();
        let mut proposed = Vec::new();
        for s in &mut self.running {
            let Some(n) = s.chunk.take() else { continue };
            let plan = &planned[&s.id];
            seqs.push((s.id, n));
            paced.push(plan.paced);
            // A chunk the pool shrank holds fewer drafts than planned.
            proposed.push(
                plan.tokens
                    .iter()
                    .copied()
                    .take(n - 1)
                    .collect::<Vec<u32>>(),
            );
            // Row j draws the token after j drafts, which the model counts as pending.
            let adjust = match s.adjusts_with_pick() {
                true => (0..n).filter_map(|j| s.logit_adjust_ahead(j, j)).collect(),
                false => Vec::new(),
            };
            rows.push(DraftRow {
                request: s.kv.expect("running requests hold a pool request"),
                start: s.computed,
                token: s.tokens[s.computed],
                drafts: n - 1,
                draws: row_draws(s, n),
                adjust,
                adapter: s.req.adapter,
            });
        }
        if rows.is_empty() {
            return;
        }
        let t = Instant::now();
        let checked = if self.model.draft_tokens() > 0 {
            let (running, stats, vocab) = (
                &mut self.running,
                &mut self.mask_stats,
                self.model.vocab_size(),
            );
            let mut masks = |i: usize, drafts: &[u32]| {
                let seq = running.iter_mut().find(|s| s.id == seqs[i].0);
                draft_masks(seq, drafts, vocab, stats)
            };
            self.model.speculate(&mut self.pool, &rows, &mut masks)
        } else {
            self.check_proposals(&seqs, &rows, proposed)
        };
        self.last_launch = Some(LaunchShape {
            single_rows: rows.len(),
            chunk_tokens: 0,
            overlapped: false,
            launch_seconds: t.elapsed().as_secs_f64(),
            drafts: rows.iter().map(|r| r.drafts).sum(),
        });
        match checked {
            Ok(out) if out.len() == rows.len() => {
                self.apply_round(&seqs, &rows, &out, &paced, events)
            }
            Ok(out) => self.fail_batch(
                &seqs,
                format!(
                    "a speculative round returned {} of {} rows",
                    out.len(),
                    rows.len()
                ),
                events,
            ),
            Err(e) => self.fail_batch(&seqs, e.to_string(), events),
        }
    }

    /// Checks the scheduler's own drafts (prompt lookup) of `rows` (of the requests
    /// `seqs`) in one model step.
    fn check_proposals(
        &mut self,
        seqs: &[(SeqId, usize)],
        rows: &[DraftRow],
        proposed: Vec<Vec<u32>>,
    ) -> Result<Vec<CheckedRow>, crate::SchedError> {
        let vocab = self.model.vocab_size();
        let mut check = Vec::with_capacity(rows.len());
        for ((r, p), &(id, _)) in rows.iter().zip(proposed).zip(seqs) {
            let seq = self.running.iter_mut().find(|s| s.id == id);
            let masks = draft_masks(seq, &p, vocab, &mut self.mask_stats)
                .map_err(crate::SchedError::Other)?;
            check.push(CheckRow {
                request: r.request,
                start: r.start,
                tokens: std::iter::once(r.token).chain(p).collect(),
                draws: r.draws.clone(),
                adjust: r.adjust.clone(),
                masks,
                adapter: r.adapter,
            });
        }
        self.model.verify(&mut self.pool, &check)
    }

    /// Drafts per request for this round, capped by what the request may still generate,
    /// the context and the step's token budget. With a drafting model: its number where the
    /// request drafts now and the model kept its state, else 0 (a plain row, which leaves
    /// the state for the next round). With prompt lookup: the lookup's proposal where the
    /// request drafts now, then every row filled to the longest proposal with copies of its
    /// pending token, so that the rows are alike (one captured verification graph serves
    /// them); only rows with a proposal of their own count towards their pace.
    fn plan_drafts(&self) -> HashMap<SeqId, Planned> {
        let model_k = self.model.draft_tokens();
        let k = self
            .config
            .prompt_lookup
            .map_or(model_k, |l| l.draft_tokens);
        let context_len = self.model.context_len();
        let per_row = (self.config.max_batch_tokens / self.running.len().max(1)).max(1) - 1;
        let limit = |s: &Seq| {
            // A round yields up to drafts + 1 tokens; its K/V reaches start + drafts.
            let left = s.req.max_tokens.saturating_sub(s.completion().len());
            let room = context_len.map_or(usize::MAX, |c| c.saturating_sub(s.computed + 1));
            k.min(left.saturating_sub(1)).min(room).min(per_row)
        };
        let drafts_now = |s: &Seq| s.pace.drafts_at(s.completion().len());
        let Some(lookup) = self.config.prompt_lookup.filter(|_| model_k == 0) else {
            return self
                .running
                .iter()
                .map(|s| {
                    let kv = s.kv.expect("running requests hold a pool request");
                    let drafts = if drafts_now(s) && self.model.can_draft(kv, s.computed) {
                        limit(s)
                    } else {
                        0
                    };
                    let plan = Planned {
                        drafts,
                        tokens: Vec::new(),
                        paced: drafts > 0,
                    };
                    (s.id, plan)
                })
                .collect();
        };
        let proposals: Vec<Vec<u32>> = self
            .running
            .iter()
            .map(|s| match drafts_now(s) {
                true => lookup.propose(&s.tokens, limit(s)),
                false => Vec::new(),
            })
            .collect();
        let longest = proposals.iter().map(Vec::len).max().unwrap_or(0);
        self.running
            .iter()
            .zip(proposals)
            .map(|(s, mut tokens)| {
                let paced = !tokens.is_empty();
                let drafts = longest.min(limit(s));
                let pending = s.tokens[s.computed];
                tokens.resize(drafts, pending);
                let plan = Planned {
                    drafts,
                    tokens,
                    paced,
                };
                (s.id, plan)
            })
            .collect()
    }

    /// Keeps each request's agreed drafts and the target's token after them, stopping at
    /// the first token that ends the request; drops the K/V of the rest.
    fn apply_round(
        &mut self,
        seqs: &[(SeqId, usize)],
        rows: &[DraftRow],
        out: &[CheckedRow],
        paced: &[bool],
        events: &mut Vec<Event>,
    ) {
        let context_len = self.model.context_len();
        let mut done: Vec<(SeqId, FinishReason)> = Vec::new();
        self.draft_stats.rounds += 1;
        for (((&(id, _), row), checked), &paced) in seqs.iter().zip(rows).zip(out).zip(paced) {
            let Ok(i) = self.running.binary_search_by_key(&id, |s| s.id) else {
                continue;
            };
            let scored = row.draws.iter().any(|d| d.logprobs.is_some());
            if checked.drafts.len() != row.drafts
                || checked.picked.len() != row.drafts + 1
                || (scored && checked.logprobs.len() != row.drafts + 1)
            {
                let e = format!(
                    "a speculative round returned {} drafts, {} checked tokens and {} scores \
                     for {} drafts",
                    checked.drafts.len(),
                    checked.picked.len(),
                    checked.logprobs.len(),
                    row.drafts
                );
                done.push((id, FinishReason::Error(e)));
                continue;
            }
            let agreed = checked.agreed();
            self.draft_stats.drafted += row.drafts as u64;
            self.draft_stats.accepted += agreed as u64;
            let seq = &mut self.running[i];
            let mut kept = 0;
            let mut reason = None;
            // Kept drafts equal the model's own tokens: row j's token (and its scores) is
            // the one plain decoding would have produced there.
            for (j, &token) in checked.picked[..=agreed].iter().enumerate() {
                seq.tokens.push(token);
                kept += 1;
                let scores = checked.logprobs.get(j).and_then(Option::as_ref);
                events.push(Event {
                    id,
                    kind: EventKind::Token {
                        token,
                        logprob: scores.map(|s| s.logprob),
                        top_logprobs: scores.map(|s| s.top.clone()).unwrap_or_default(),
                    },
                });
                // The grammar takes each kept token, as in a plain step (`apply`).
                reason = match seq.req.constraint.as_mut().map(|c| c.0.commit(token)) {
                    Some(Ok(true)) => Some(FinishReason::Stop),
                    Some(Err(e)) => Some(FinishReason::Error(e)),
                    Some(Ok(false)) | None => seq.stop_reason(context_len),
                };
                if reason.is_some() {
                    break;
                }
            }
            // Positions `start..start + kept` hold the K/V of kept inputs; the rest go.
            seq.computed = row.start + kept;
            if paced && row.drafts > 0 {
                let completion = seq.completion().len();
                seq.pace.record(agreed, row.drafts, completion);
            }
            let len = seq.computed;
            let commit = commit_len(len, self.pool.page_size(), true);
            let kv = row.request;
            if let Err(e) = self
                .pool
                .truncate(kv, len)
                .and_then(|()| self.pool.commit(kv, commit))
            {
                done.push((id, FinishReason::Error(e.to_string())));
                continue;
            }
            if let Some(reason) = reason {
                done.push((id, reason));
            }
        }
        for (id, reason) in done {
            if let Some(i) = self.running.iter().position(|s| s.id == id) {
                let seq = self.running.remove(i);
                events.push(self.finish(seq, reason));
            }
        }
    }
}

/// The length to commit for a request with `computed` tokens of K/V: whole pages only
/// (see `apply`), and with a drafter one token short, since a draft from the next token's
/// position reads the keys a query one position earlier sees.
pub(crate) fn commit_len(computed: usize, page_size: usize, drafting: bool) -> usize {
    let len = if drafting {
        computed.saturating_sub(1)
    } else {
        computed
    };
    len / page_size * page_size
}

/// The grammar masks of the checked rows of `seq` (if it still runs and has a grammar)
/// for `drafts`, as [`crate::CheckRow::masks`], counted in `stats`.
fn draft_masks(
    seq: Option<&mut Seq>,
    drafts: &[u32],
    vocab: usize,
    stats: &mut MaskStats,
) -> Result<Vec<RowMask>, String> {
    let Some(c) = seq.and_then(|s| s.req.constraint.as_mut()) else {
        return Ok(Vec::new());
    };
    let t = Instant::now();
    let masks = c.0.masks_ahead(drafts, vocab)?;
    stats.masks += masks.len() as u64;
    stats.seconds += t.elapsed().as_secs_f64();
    Ok(masks
        .into_iter()
        .enumerate()
        .map(|(row, allowed)| RowMask { row, allowed })
        .collect())
}

/// The rows of `seq`'s run of `n` checked tokens whose token is drawn: row `j` yields token
/// number `computed + j + 1`, drawn with that token's uniform, as plain decoding draws it
/// (every row of a round is the model's pick, masked ones included).
fn row_draws(seq: &Seq, n: usize) -> Vec<RowDraw> {
    (0..n)
        .filter_map(|j| match seq.pick_mode(seq.computed + j + 1) {
            LogitsMode::Draw {
                params,
                uniform,
                logprobs,
            } => Some(RowDraw {
                row: j,
                params,
                uniform,
                logprobs,
            }),
            _ => None,
        })
        .collect()
}
