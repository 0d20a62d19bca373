//! One scheduling iteration: plan the batch, run the model, sample, report.

use strata_kv::KvStorage;
use strata_types::sampling::{
    adjust_logits, draw_uniform, sample, token_logprobs, RowMask, TokenLogprobs,
};
use strata_types::{ForwardBatch, ForwardOutput, LogitsMode, RowEmbeds, SeqChunk};

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::overlap::InFlight;
use crate::reserve::Reserved;
use crate::seq::Seq;
use crate::{Event, EventKind, FinishReason, LaunchShape, SchedError, Scheduler, SeqId, StepModel};

/// A host draw: the token, its logprob and top logprobs (when asked for), or why it failed.
type Draw = Result<(u32, Option<f32>, Vec<(u32, f32)>), String>;

impl<M: StepModel<S>, S: KvStorage> Scheduler<M, S> {
    /// Runs one iteration: admits what fits, computes one forward pass over every running
    /// request (decode tokens first, then prefill chunks, oldest first, within
    /// `max_batch_tokens`), samples, and returns the events it produced in order.
    ///
    /// With a drafter or prompt lookup, a step over few decode rows is a speculative round instead
    /// (`speculate.rs`).
    ///
    /// With `SchedulerConfig::overlap`, a decode step of tokens only (greedy or drawn, with
    /// their logprobs where asked for) is left queued on the model and read by the next call, after that call has queued the step that follows it
    /// (`launch_next`): the events of a step then come one call later.
    pub fn step(&mut self) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.pending);
        self.last_launch = None;
        if let Some(prev) = self.in_flight.take() {
            let t = Instant::now();
            self.in_flight = self.launch_next(&prev);
            if let Some(next) = &self.in_flight {
                self.last_launch = Some(LaunchShape {
                    single_rows: next.seqs.len(),
                    chunk_tokens: 0,
                    overlapped: true,
                    launch_seconds: t.elapsed().as_secs_f64(),
                    drafts: 0,
                });
            }
            let fed = self.read(prev, &mut events);
            // The grammars have taken `prev`'s tokens: the queued step's masks now, while
            // it runs.
            if let Some(mut next) = self.in_flight.take() {
                match self.pick_in_flight(&mut next, &fed) {
                    Ok(()) => self.in_flight = Some(next),
                    Err(e) => self.fail_batch(&next.seqs, e.to_string(), &mut events),
                }
            }
            return events;
        }
        if self.wants_round(false) {
            self.round(&mut events);
            return events;
        }
        self.plan(&mut events);
        let (batch, masked) = self.batch();
        if batch.seqs.is_empty() {
            return events;
        }
        let seqs = self.take_chunks();
        let t = Instant::now();
        let mut launched = self.model.launch(&mut self.pool, &batch, None);
        if let (Ok(step), false) = (&mut launched, masked.is_empty()) {
            // The forward pass is queued: the masks are computed while it runs.
            let rows: Vec<(SeqId, usize)> = masked.into_iter().zip(batch.masked.clone()).collect();
            let picked = self
                .masks(&rows)
                .map_err(SchedError::Other)
                .and_then(|m| self.model.pick_masked(step, &m, &[]));
            if let Err(e) = picked {
                self.fail_batch(&seqs, e.to_string(), &mut events);
                return events;
            }
        }
        self.last_launch = Some(LaunchShape {
            single_rows: seqs.iter().filter(|&&(_, n)| n == 1).count(),
            chunk_tokens: seqs.iter().map(|&(_, n)| n).filter(|&n| n > 1).sum(),
            overlapped: false,
            launch_seconds: t.elapsed().as_secs_f64(),
            drafts: 0,
        });
        match launched {
            Ok(step) => {
                let launched = InFlight {
                    step,
                    seqs,
                    masked: Vec::new(),
                };
                if self.config.overlap && self.model.feeds(&launched.step) {
                    self.in_flight = Some(launched);
                } else {
                    self.read(launched, &mut events);
                }
            }
            Err(e) => self.fail_batch(&seqs, e.to_string(), &mut events),
        }
        events
    }

    /// Waits for a launched step and applies its output; returns the step's tokens by
    /// sequence (0 where it has none), what a step fed from it counted.
    pub(crate) fn read(
        &mut self,
        step: InFlight<M::Launched>,
        events: &mut Vec<Event>,
    ) -> Vec<u32> {
        let seqs = step.seqs;
        match self.model.finish(step.step) {
            Ok(out) if out.logits.len() == seqs.len() => {
                self.apply(&seqs, &out, events);
                out.tokens.iter().map(|t| t.unwrap_or(0)).collect()
            }
            Ok(out) => {
                let e = format!(
                    "the model returned logits for {} of {} sequences",
                    out.logits.len(),
                    seqs.len()
                );
                self.fail_batch(&seqs, e, events);
                Vec::new()
            }
            Err(e) => {
                self.fail_batch(&seqs, e.to_string(), events);
                Vec::new()
            }
        }
    }

    /// The planned step's requests and token counts, in batch order (their `chunk`s
    /// taken).
    fn take_chunks(&mut self) -> Vec<(SeqId, usize)> {
        self.running
            .iter_mut()
            .filter_map(|s| Some((s.id, s.chunk.take()?)))
            .collect()
    }

    /// Chooses this step's tokens and allocates their slots (`Seq::chunk`).
    fn plan(&mut self, events: &mut Vec<Event>) {
        let mut budget = self.config.max_batch_tokens;
        // The LoRA adapters the step names so far (a request on another waits when full).
        let mut adapters = Vec::new();
        // Decode tokens first: they are latency-bound and cost one token each.
        let mut i = 0;
        while i < self.running.len() {
            let adapter = self.running[i].req.adapter;
            if self.running[i].pending() == 1 && budget > 0 && self.adapter_fits(&adapters, adapter)
            {
                match self.reserve(i, 1, events) {
                    Reserved::Tokens(n) => {
                        budget -= n;
                        take_adapter(&mut adapters, adapter);
                    }
                    Reserved::Skipped => {}
                    Reserved::Removed => continue,
                }
            }
            i += 1;
        }
        let chunk = self.config.prefill_chunk;
        let vocab = self.model.vocab_size();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let pending = self.running[i].pending();
            let adapter = self.running[i].req.adapter;
            if pending > 1 && self.adapter_fits(&adapters, adapter) {
                let cap = self.running[i].chunk_cap(chunk, vocab);
                match self.reserve(i, pending.min(cap).min(budget), events) {
                    Reserved::Tokens(n) => {
                        budget -= n;
                        take_adapter(&mut adapters, adapter);
                    }
                    Reserved::Skipped => {}
                    Reserved::Removed => continue,
                }
            }
            i += 1;
        }
        self.admit_waiting(&mut budget, &mut adapters, events);
    }

    /// Admits waiting requests in order while the budget, `max_running_requests` and the
    /// pool allow, giving each its first chunk in this step. The queue is strictly FIFO: a
    /// request that does not fit blocks the ones behind it, so large requests are not
    /// starved by small ones.
    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        adapters: &mut Vec<u32>,
        events: &mut Vec<Event>,
    ) {
        while *budget > 0 && self.running.len() < self.config.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if front.cached_tokens.is_none() {
                let refusal = self.refusal(front);
                let empty = front.req.max_tokens == 0 && !front.scores_prompt();
                if refusal.is_some() || empty {
                    let seq = self.waiting.pop_front().expect("front exists");
                    let reason = refusal.map_or(FinishReason::Length, FinishReason::Error);
                    events.push(self.finish(seq, reason));
                    continue;
                }
            }
            // A sibling sample waits (one step or a few) for its prompt's pages to be
            // cached; the queue stays FIFO behind it.
            if self.held_for_sibling(front)
                || !self.fits_now(front)
                || !self.adapter_fits(adapters, front.req.adapter)
            {
                break;
            }
            let seq = self.waiting.pop_front().expect("front exists");
            let at = self.admit(seq);
            let seq = &self.running[at];
            let cap = seq.chunk_cap(self.config.prefill_chunk, self.model.vocab_size());
            let want = seq.pending().min(cap).min(*budget);
            let adapter = seq.req.adapter;
            match self.reserve(at, want, events) {
                Reserved::Tokens(n) => {
                    *budget -= n;
                    take_adapter(adapters, adapter);
                }
                Reserved::Skipped | Reserved::Removed => break,
            }
        }
    }

    /// The forward input: the scheduled requests in running order, with the logit
    /// adjustments of those whose token the model picks and the rows whose pick waits for
    /// a grammar mask; and those rows' requests.
    fn batch(&mut self) -> (ForwardBatch, Vec<SeqId>) {
        let mut batch = ForwardBatch::default();
        let mut masked = Vec::new();
        let takes_masks = self.model.masks_picks();
        // The step's logits rows so far (what `ForwardBatch::adjust` rows count).
        let mut rows = 0;
        for s in &mut self.running {
            let Some(n) = s.chunk else { continue };
            let end = s.computed + n;
            let logits = if !s.scored_by(s.computed, n).is_empty() {
                // Prompt logprobs need every row (the last one is drawn from on the host
                // when the chunk ends the prompt).
                LogitsMode::All
            } else if end == s.tokens.len() && takes_masks && s.masked_with_pick() {
                // Picked by the model once the caller's mask arrives.
                batch.masked.push(rows);
                masked.push(s.id);
                s.pick_mode(end)
            } else if end == s.tokens.len() {
                // A request needs only its token (and its logprobs), which the model
                // computes where the logits are.
                s.token_mode(end)
            } else {
                LogitsMode::None
            };
            if logits.picks() && s.adjusts_with_pick() {
                batch.adjust.extend(s.logit_adjust_ahead(rows, 0));
            }
            rows += match logits {
                LogitsMode::None => 0,
                LogitsMode::All => n,
                _ => 1,
            };
            let seq = batch.seqs.len();
            for m in &s.req.media {
                let (a, b) = (m.start.max(s.computed), (m.start + m.rows).min(end));
                if a < b {
                    let width = m.values.len() / m.rows;
                    let from = (a - m.start) * width;
                    batch.embeds.push(RowEmbeds {
                        seq,
                        first: a - s.computed,
                        values: Arc::from(&m.values[from..from + (b - a) * width]),
                    });
                }
            }
            batch.seqs.push(SeqChunk {
                request: s.kv.expect("scheduled requests hold a pool request"),
                tokens: s.tokens[s.computed..end].to_vec(),
                start: s.computed,
                logits,
            });
            batch.adapters.push(s.req.adapter);
        }
        (batch, masked)
    }

    /// The grammar masks of `rows` (request, logits row; in running order), for their
    /// requests' next tokens, computed on the host in parallel while the step they are for
    /// runs on the device. A request that ended meanwhile (its row's output is dropped)
    /// gets a mask allowing every id.
    fn masks(&mut self, rows: &[(SeqId, usize)]) -> Result<Vec<RowMask>, String> {
        let vocab = self.model.vocab_size();
        let t = Instant::now();
        let mut seqs: Vec<&mut Seq> = self
            .running
            .iter_mut()
            .filter(|s| rows.iter().any(|r| r.0 == s.id))
            .collect();
        let mut words: Vec<(SeqId, Result<Vec<u32>, String>)> = seqs
            .par_iter_mut()
            .map(|s| {
                let w = match &mut s.req.constraint {
                    Some(c) => c.0.allowed(vocab),
                    None => Err("a masked row without a constraint".into()),
                };
                (s.id, w)
            })
            .collect();
        self.mask_stats.masks += words.len() as u64;
        self.mask_stats.seconds += t.elapsed().as_secs_f64();
        rows.iter()
            .map(|&(id, row)| {
                let allowed = match words.iter().position(|w| w.0 == id) {
                    Some(i) => words.swap_remove(i).1?,
                    None => vec![u32::MAX; vocab.div_ceil(32)],
                };
                Ok(RowMask { row, allowed })
            })
            .collect()
    }

    /// Gives a queued step whose picks wait for grammar masks its masks (its requests'
    /// grammars have taken the tokens of the step before it, `fed`).
    fn pick_in_flight(
        &mut self,
        next: &mut InFlight<M::Launched>,
        fed: &[u32],
    ) -> Result<(), SchedError> {
        if next.masked.is_empty() {
            return Ok(());
        }
        let masks = self.masks(&next.masked).map_err(SchedError::Other)?;
        next.masked.clear();
        self.model.pick_masked(&mut next.step, &masks, fed)
    }

    /// Commits the computed tokens of a step over `seqs` (requests and token counts in
    /// batch order), samples where a request reached its end, and finishes the requests
    /// that stop. Requests that ended while the step ran (cancelled, or stopped by the
    /// step before, with this one queued behind it) are skipped.
    fn apply(&mut self, seqs: &[(SeqId, usize)], out: &ForwardOutput, events: &mut Vec<Event>) {
        let context_len = self.model.context_len();
        let caching = self.caching();
        let drafting = self.model.draft_tokens() > 0;
        let page_size = self.pool.page_size();
        let commit_len = |computed| crate::speculate::commit_len(computed, page_size, drafting);
        let mut done: Vec<(SeqId, FinishReason)> = Vec::new();
        let mut draws = self.draw_samples(seqs, out);
        for (b, &(id, n)) in seqs.iter().enumerate() {
            let Ok(i) = self.running.binary_search_by_key(&id, |s| s.id) else {
                continue;
            };
            let seq = &mut self.running[i];
            let kv = seq.kv.expect("scheduled requests hold a pool request");
            match score_prompt(seq, n, &out.logits[b], out.vocab) {
                Ok(Some(kind)) => events.push(Event { id, kind }),
                Ok(None) => {}
                Err(e) => {
                    done.push((seq.id, FinishReason::Error(e)));
                    continue;
                }
            }
            seq.computed += n;
            // Committing lets the pool release window pages that fell out of the sliding
            // window. Whole pages only: the cache keeps whole pages, and a prefix ending at
            // the last page boundary is reusable only while the window pages just before
            // that boundary exist, so they are kept (at most a page more than needed).
            let final_len = commit_len(seq.computed);
            if let Err(e) = self.pool.commit(kv, final_len) {
                done.push((seq.id, FinishReason::Error(e.to_string())));
                continue;
            }
            if seq.computed < seq.tokens.len() {
                continue;
            }
            if !seq.prefilled {
                // The prompt (or, after a preemption, everything so far) is in: other
                // requests can branch from it while this one decodes.
                seq.prefilled = true;
                if caching && !seq.restarted_alone {
                    let key = seq.cache_key(seq.computed);
                    if let Ok(held) = self.pool.cache_prefix(kv, &key) {
                        seq.pinned = held;
                    }
                }
            }
            if seq.completion().len() >= seq.req.max_tokens {
                // Only a prompt-scoring request gets here (with `max_tokens` 0): others stop
                // on their last token.
                done.push((seq.id, FinishReason::Length));
                continue;
            }
            // The model's token (picked where the logits are), else the host's draw.
            let picked = model_pick(out, b, seq).map(|(token, scores)| {
                let logprob = scores.map(|s| s.logprob);
                (
                    token,
                    logprob,
                    scores.map(|s| s.top.clone()).unwrap_or_default(),
                )
            });
            let (token, logprob, top) = match picked.map(Ok).or_else(|| draws[b].take()) {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    done.push((seq.id, FinishReason::Error(e)));
                    continue;
                }
                None => {
                    done.push((
                        seq.id,
                        FinishReason::Error("the model returned no logits".into()),
                    ));
                    continue;
                }
            };
            seq.tokens.push(token);
            events.push(Event {
                id: seq.id,
                kind: EventKind::Token {
                    token,
                    logprob,
                    top_logprobs: top,
                },
            });
            // Either way the token advances the request's grammar, if it has one.
            let complete = match &mut seq.req.constraint {
                Some(c) => c.0.commit(token),
                None => Ok(false),
            };
            match complete {
                Ok(true) => done.push((seq.id, FinishReason::Stop)),
                Err(e) => done.push((seq.id, FinishReason::Error(e))),
                Ok(false) => {
                    if let Some(reason) = seq.stop_reason(context_len) {
                        done.push((seq.id, reason));
                    }
                }
            }
        }
        for (id, reason) in done {
            let i = self
                .running
                .iter()
                .position(|s| s.id == id)
                .expect("finishing a running request");
            let seq = self.running.remove(i);
            events.push(self.finish(seq, reason));
        }
    }

    /// The host's draws of a step (rows without a token from the model, whose
    /// request reached its last token), by batch row: the token, and its logprob and top
    /// logprobs where the request asked for them. Each draw takes its request's uniform for
    /// that token, so the rows are drawn in parallel (`&mut` only because a request is
    /// `Send` but not `Sync`): at Gemma's 262,144 ids one draw costs
    /// milliseconds (`cargo bench -p strata-kernels -- sample_row`).
    fn draw_samples(&mut self, seqs: &[(SeqId, usize)], out: &ForwardOutput) -> Vec<Option<Draw>> {
        let mut row_of = vec![None; self.running.len()];
        let mut rows = 0;
        for (b, &(id, n)) in seqs.iter().enumerate() {
            let Ok(i) = self.running.binary_search_by_key(&id, |s| s.id) else {
                continue;
            };
            let seq = &self.running[i];
            let picked = model_pick(out, b, seq);
            let logits = out.last(b).filter(|l| l.len() == out.vocab);
            let wants_token = seq.completion().len() < seq.req.max_tokens;
            if seq.computed + n >= seq.tokens.len()
                && wants_token
                && picked.is_none()
                && logits.is_some()
            {
                row_of[i] = Some(b);
                rows += 1;
            }
        }
        let draw = |(seq, b): (&mut Seq, usize)| {
            let logits = out.last(b).expect("checked above");
            let (d, mask) = draw_row(seq, logits);
            (b, d, mask)
        };
        let picked = self.running.iter_mut().zip(&row_of);
        let drawn: Vec<(usize, Draw, Option<f64>)> = if rows > 1 {
            let picked: Vec<(&mut Seq, usize)> =
                picked.filter_map(|(s, b)| Some((s, (*b)?))).collect();
            picked.into_par_iter().map(draw).collect()
        } else {
            picked
                .filter_map(|(s, b)| Some((s, (*b)?)))
                .map(draw)
                .collect()
        };
        let mut by_row: Vec<Option<Draw>> = (0..seqs.len()).map(|_| None).collect();
        for (b, d, mask) in drawn {
            by_row[b] = Some(d);
            if let Some(seconds) = mask {
                self.mask_stats.masks += 1;
                self.mask_stats.seconds += seconds;
            }
        }
        by_row
    }

    /// The forward pass over `seqs` failed: every request in it ends with the error (their
    /// K/V may be half written); the others carry on.
    pub(crate) fn fail_batch(
        &mut self,
        seqs: &[(SeqId, usize)],
        error: String,
        events: &mut Vec<Event>,
    ) {
        for &(id, _) in seqs {
            if let Ok(i) = self.running.binary_search_by_key(&id, |s| s.id) {
                let seq = self.running.remove(i);
                events.push(self.finish(seq, FinishReason::Error(error.clone())));
            }
        }
    }
}

/// Notes `adapter` (0: none) among a step's adapters.
fn take_adapter(adapters: &mut Vec<u32>, adapter: u32) {
    if adapter != 0 && !adapters.contains(&adapter) {
        adapters.push(adapter);
    }
}

/// The token the model picked for batch row `b` and its logprobs, when it picked one with
/// everything `seq`'s request asks for (else the request is drawn on the host from its
/// logits).
fn model_pick<'a>(
    out: &'a ForwardOutput,
    b: usize,
    seq: &Seq,
) -> Option<(u32, Option<&'a TokenLogprobs>)> {
    let token = out.token(b).filter(|&t| (t as usize) < out.vocab)?;
    let scores = out.token_logprobs(b);
    (seq.req.logprobs.is_none() || scores.is_some()).then_some((token, scores))
}

/// Draws `seq`'s next token from its row of `logits`, masked by its constraint if it has
/// one; the logprobs (when asked for) are of the raw distribution, as for every request.
/// Also returns the host seconds its mask took (`None` without a constraint).
fn draw_row(seq: &mut Seq, logits: &[f32]) -> (Draw, Option<f64>) {
    let mut mask = None;
    let d = draw_masked(seq, logits, &mut mask);
    (d, mask)
}

fn draw_masked(seq: &mut Seq, logits: &[f32], mask_time: &mut Option<f64>) -> Draw {
    let uniform = draw_uniform(seq.seed, seq.tokens.len() as u64);
    // Logit controls (bias, penalties, `min_tokens`) first, then the grammar's mask: they
    // change the draw, not the reported logprobs, which stay the raw model's (as vLLM
    // reports them by default).
    let mut row = seq.logit_adjust().map(|a| {
        let mut row = logits.to_vec();
        adjust_logits(&mut row, &a);
        row
    });
    if let Some(c) = &mut seq.req.constraint {
        let t = Instant::now();
        let masked = c.0.mask(row.get_or_insert_with(|| logits.to_vec()));
        *mask_time = Some(t.elapsed().as_secs_f64());
        masked?;
    }
    let token = sample(row.as_deref().unwrap_or(logits), &seq.req.sampling, uniform)
        .map_err(|e| e.to_string())?;
    Ok(match seq.req.logprobs {
        Some(k) => {
            let scores = token_logprobs(logits, token, k);
            (token, Some(scores.logprob), scores.top)
        }
        None => (token, None, Vec::new()),
    })
}

/// The prompt logprobs that a chunk of `n` tokens of `seq` (from `seq.computed`) yields
/// from its `logits` rows, as an event, recorded as reported; `None` when it yields none.
fn score_prompt(
    seq: &mut Seq,
    n: usize,
    logits: &[f32],
    vocab: usize,
) -> Result<Option<EventKind>, String> {
    let start = seq.computed;
    let positions = seq.scored_by(start, n);
    if positions.is_empty() {
        return Ok(None);
    }
    if logits.len() != n * vocab {
        return Err(format!(
            "the model returned {} logits for a scored chunk of {n} tokens",
            logits.len()
        ));
    }
    let top = seq.req.prompt_logprobs.unwrap_or(0);
    let tokens = &seq.tokens;
    let first = positions.start;
    // Row `p - 1 - start` predicts token `p`. Rows are independent: score them in parallel
    // (each is a log-softmax over the vocabulary).
    let scores: Vec<TokenLogprobs> = positions
        .clone()
        .into_par_iter()
        .map(|p| {
            let row = p - 1 - start;
            token_logprobs(&logits[row * vocab..(row + 1) * vocab], tokens[p], top)
        })
        .collect();
    seq.prompt_scored = positions.end;
    Ok(Some(EventKind::PromptLogprobs {
        start: first,
        scores,
    }))
}
