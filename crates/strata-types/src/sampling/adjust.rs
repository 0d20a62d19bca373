//! Logit adjustments that depend on a request's own tokens: `logit_bias`, the OpenAI
//! presence and frequency penalties, transformers' repetition penalty, and the `min_tokens`
//! mask. They change a row's logits before the draw ([`adjust_logits`]); the draw itself
//! (temperature, top-k, top-p, min-p) is unchanged.
//!
//! Order: bias first, then the penalties (repetition, then frequency and presence), then
//! the mask. vLLM's sampler gives the same: it masks and biases, then penalises. The bias
//! comes before the penalties, so the repetition penalty's sign test sees the biased
//! logit; the mask sets -inf, which every penalty keeps, so it could come anywhere.
//!
//! A request's state is a [`TokenCounts`], updated with each new token rather than
//! recounted; each step it yields a [`RowAdjust`], the list form a backend applies.

use std::collections::HashMap;

use super::{feed_tokens, FED_TOKEN};
use crate::error::Result;
use crate::SamplingError;

/// Largest magnitude of a presence or frequency penalty (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;
/// Largest magnitude of a `logit_bias` value (OpenAI's range).
pub const MAX_BIAS: f32 = 100.0;
/// Most pending tokens a row may list ([`RowAdjust::pending`]): a device counts them by
/// scanning the list once per penalised id.
pub const MAX_PENDING: usize = 64;

/// A request's logit controls. The default changes nothing ([`LogitControls::is_neutral`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LogitControls {
    /// Subtracted once from the logit of every token the completion holds (OpenAI).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the completion holds it (OpenAI).
    pub frequency_penalty: f32,
    /// transformers' rule over prompt and completion tokens: a positive logit is divided by
    /// it, a negative one multiplied; 1 is off.
    pub repetition_penalty: f32,
    /// Added to the logits of these token ids (at most one entry per id).
    pub logit_bias: Vec<(u32, f32)>,
    /// The end-of-sequence and stop ids are masked until the completion holds this many
    /// tokens.
    pub min_tokens: usize,
}

impl Default for LogitControls {
    fn default() -> Self {
        Self {
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
        }
    }
}

impl LogitControls {
    /// Whether these controls leave every logit as it is.
    pub fn is_neutral(&self) -> bool {
        self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.repetition_penalty == 1.0
            && self.logit_bias.is_empty()
            && self.min_tokens == 0
    }

    /// `Err((field, why))` for the first control out of its range, `field` its OpenAI
    /// name (`vocab` bounds the biased ids).
    pub fn validate(&self, vocab: usize) -> std::result::Result<(), (&'static str, String)> {
        let penalty = |x: f32| x.is_finite() && x.abs() <= MAX_PENALTY;
        for (field, x) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !penalty(x) {
                return Err((field, format!("{field} {x} must be in [-2, 2]")));
            }
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err((
                "repetition_penalty",
                format!("repetition_penalty {r} must be finite and > 0"),
            ));
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab {
                return Err((
                    "logit_bias",
                    format!("logit_bias token {id} is outside the vocabulary of {vocab}"),
                ));
            }
            if !(b.is_finite() && b.abs() <= MAX_BIAS) {
                return Err((
                    "logit_bias",
                    format!("logit_bias {b} of token {id} must be in [-100, 100]"),
                ));
            }
        }
        Ok(())
    }
}

/// What a backend applies to one row of logits ([`adjust_logits`]): the lists come from a
/// request's [`LogitControls`] and [`TokenCounts`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowAdjust {
    /// Index of the row in the step's logits.
    pub row: usize,
    /// As [`LogitControls::presence_penalty`].
    pub presence_penalty: f32,
    /// As [`LogitControls::frequency_penalty`].
    pub frequency_penalty: f32,
    /// As [`LogitControls::repetition_penalty`].
    pub repetition_penalty: f32,
    /// `(token, bias)`: added to the token's logit.
    pub bias: Vec<(u32, f32)>,
    /// `(token, count)`, each token of the prompt or completion once, `count` its
    /// occurrences in the completion (0 for a prompt-only token).
    pub seen: Vec<(u32, u32)>,
    /// Tokens set to -inf (`min_tokens` not reached).
    pub masked: Vec<u32>,
    /// Completion tokens not yet counted in `seen`, each one more occurrence: an id, or
    /// [`FED_TOKEN`]` | r` for row `r` of the tokens the step is fed from (an earlier step's
    /// picks, not yet read by the host; id 0 past their rows, as [`feed_tokens`] has it).
    /// Used only with a penalty on.
    pub pending: Vec<u32>,
}

impl RowAdjust {
    /// Whether a penalty is on (else `seen` and `pending` change nothing).
    pub fn penalises(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// This adjustment with `pending` counted into `seen`, its marks resolved against
    /// `fed` (the feeding step's token ids).
    pub fn resolved(&self, fed: &[u32]) -> RowAdjust {
        let mut a = RowAdjust {
            pending: Vec::new(),
            ..self.clone()
        };
        if !self.penalises() {
            return a;
        }
        let mut ids = self.pending.clone();
        feed_tokens(&mut ids, fed);
        for t in ids {
            match a.seen.iter_mut().find(|s| s.0 == t) {
                Some(s) => s.1 += 1,
                None => a.seen.push((t, 1)),
            }
        }
        a
    }

    /// `Err` saying why a backend cannot apply this: an id at or past `vocab`, or an id
    /// listed twice in `bias` or in `seen` (a device applies a list's entries in parallel,
    /// so each must touch its own logit).
    pub fn check(&self, vocab: usize) -> std::result::Result<(), String> {
        let bias: Vec<u32> = self.bias.iter().map(|b| b.0).collect();
        let seen: Vec<u32> = self.seen.iter().map(|s| s.0).collect();
        let pending: Vec<u32> = self
            .pending
            .iter()
            .copied()
            .filter(|&t| t & FED_TOKEN == 0)
            .collect();
        if self.pending.len() > MAX_PENDING {
            return Err(format!(
                "{} pending tokens (at most {MAX_PENDING})",
                self.pending.len()
            ));
        }
        for (name, mut list, distinct) in [
            ("bias", bias, true),
            ("seen", seen, true),
            ("masked", self.masked.clone(), false),
            ("pending", pending, false),
        ] {
            if let Some(bad) = list.iter().find(|&&t| t as usize >= vocab) {
                return Err(format!("{name} id {bad} is past the vocabulary of {vocab}"));
            }
            list.sort_unstable();
            if distinct && list.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("{name} lists an id twice"));
            }
        }
        Ok(())
    }
}

/// The penalties' rule for one logit: `count` occurrences in the completion, the token
/// present in the prompt or the completion. Repetition first (transformers: divide a
/// positive logit, multiply a negative one), then frequency and presence (OpenAI).
pub fn penalised(logit: f32, count: u32, presence: f32, frequency: f32, repetition: f32) -> f32 {
    let x = if logit > 0.0 {
        logit / repetition
    } else {
        logit * repetition
    };
    let present = if count > 0 { presence } else { 0.0 };
    x - frequency * count as f32 - present
}

/// Applies `a` to one row of logits in place: bias, then penalties, then mask (the module's
/// order). Ids past the row are ignored (the lists are validated against the vocabulary);
/// marks among `pending` count as id 0 (no fed tokens here: see [`adjust_rows`]).
pub fn adjust_logits(logits: &mut [f32], a: &RowAdjust) {
    if !a.pending.is_empty() {
        return adjust_logits(logits, &a.resolved(&[]));
    }
    for &(id, b) in &a.bias {
        if let Some(x) = logits.get_mut(id as usize) {
            *x += b;
        }
    }
    for &(id, count) in &a.seen {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = penalised(
                *x,
                count,
                a.presence_penalty,
                a.frequency_penalty,
                a.repetition_penalty,
            );
        }
    }
    for &id in &a.masked {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Checks `rows`, indices into `logits [.., vocab]` of `len` values, for an op that adjusts
/// or masks them: each inside the logits, none listed twice (a device changes the listed
/// rows at once, a block each, so a row listed twice would race with itself).
pub fn check_rows(
    op: &'static str,
    rows: impl IntoIterator<Item = usize>,
    vocab: usize,
    len: usize,
) -> Result<()> {
    let shape = |detail: String| SamplingError::Shape { op, detail };
    let mut listed: Vec<usize> = rows.into_iter().collect();
    listed.sort_unstable();
    if listed.windows(2).any(|w| w[0] == w[1]) {
        return Err(shape("a row listed twice".into()));
    }
    match listed.last() {
        Some(&last) if vocab == 0 || (last + 1).saturating_mul(vocab) > len => {
            Err(shape(format!("row {last} of {vocab} past {len} logits")))
        }
        _ => Ok(()),
    }
}

/// The host definition of `strata_kernels::Backend::adjust_logits`: [`adjust_logits`] on
/// row `a.row` of `logits [.., vocab]` for each `a` of `rows`, its pending tokens resolved
/// against `fed` (the feeding step's ids), each checked first ([`RowAdjust::check`]; a row
/// listed twice is refused too, since a device adjusts the rows at once).
pub fn adjust_rows(
    logits: &mut [f32],
    vocab: usize,
    rows: &[RowAdjust],
    fed: &[u32],
) -> Result<()> {
    check_rows(
        "adjust_rows",
        rows.iter().map(|a| a.row),
        vocab,
        logits.len(),
    )?;
    for a in rows {
        let end = (a.row + 1) * vocab;
        a.check(vocab).map_err(|detail| SamplingError::Invalid {
            op: "adjust_rows",
            detail,
        })?;
        adjust_logits(&mut logits[a.row * vocab..end], &a.resolved(fed));
    }
    Ok(())
}

/// A grammar's allowed tokens for one row of logits ([`mask_rows`]): bit `t % 32` of word
/// `t / 32` of `allowed` is set when token `t` may be drawn. Ids past the words are not
/// allowed (a model's rows may outnumber its tokenizer's ids).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowMask {
    /// Index of the row in the step's logits.
    pub row: usize,
    /// The allowed ids as bits.
    pub allowed: Vec<u32>,
}

impl RowMask {
    /// Whether token `t` may be drawn.
    pub fn allows(&self, t: usize) -> bool {
        self.allowed
            .get(t / 32)
            .is_some_and(|w| (w >> (t % 32)) & 1 == 1)
    }
}

/// The host definition of `strata_kernels::Backend::mask_logits`: every disallowed logit of
/// row `m.row` of `logits [.., vocab]` set to -inf, for each `m` of `rows` (a row listed
/// twice, or past the logits, is refused).
pub fn mask_rows(logits: &mut [f32], vocab: usize, rows: &[RowMask]) -> Result<()> {
    check_rows("mask_rows", rows.iter().map(|m| m.row), vocab, logits.len())?;
    for m in rows {
        let end = (m.row + 1) * vocab;
        for (t, x) in logits[m.row * vocab..end].iter_mut().enumerate() {
            if !m.allows(t) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    Ok(())
}

/// A sequence's token counts for the penalties, brought up to date token by token
/// ([`TokenCounts::update`]): the work per step is the new tokens, not the sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenCounts {
    /// Tokens of the sequence already counted.
    counted: usize,
    /// Per distinct token: occurrences in the completion (0 when only in the prompt).
    counts: HashMap<u32, u32>,
}

impl TokenCounts {
    /// Counts `tokens[counted..]`, the sequence being the prompt (`prompt_len` tokens)
    /// then the completion. The sequence only grows, so earlier tokens stay counted.
    pub fn update(&mut self, tokens: &[u32], prompt_len: usize) {
        for (i, &t) in tokens.iter().enumerate().skip(self.counted) {
            let c = self.counts.entry(t).or_insert(0);
            if i >= prompt_len {
                *c += 1;
            }
        }
        self.counted = self.counted.max(tokens.len());
    }

    /// The adjustment of row `row` for a request with these controls and `completion`
    /// tokens so far; `end_ids` are masked while `completion < min_tokens`. The penalty
    /// list is sorted by id (a deterministic order for every backend).
    pub fn row_adjust(
        &self,
        row: usize,
        controls: &LogitControls,
        completion: usize,
        end_ids: &[u32],
    ) -> RowAdjust {
        let penalties = controls.presence_penalty != 0.0
            || controls.frequency_penalty != 0.0
            || controls.repetition_penalty != 1.0;
        let mut seen: Vec<(u32, u32)> = match penalties {
            true => self.counts.iter().map(|(&t, &c)| (t, c)).collect(),
            false => Vec::new(),
        };
        seen.sort_unstable();
        RowAdjust {
            row,
            presence_penalty: controls.presence_penalty,
            frequency_penalty: controls.frequency_penalty,
            repetition_penalty: controls.repetition_penalty,
            bias: controls.logit_bias.clone(),
            seen,
            masked: match completion < controls.min_tokens {
                true => end_ids.to_vec(),
                false => Vec::new(),
            },
            pending: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> LogitControls {
        LogitControls::default()
    }

    #[test]
    fn the_penalty_rule_against_hand_computed_values() {
        // Repetition 2 halves a positive logit and doubles a negative one.
        assert_eq!(penalised(3.0, 0, 0.0, 0.0, 2.0), 1.5);
        assert_eq!(penalised(-3.0, 0, 0.0, 0.0, 2.0), -6.0);
        assert_eq!(penalised(0.0, 0, 0.0, 0.0, 2.0), 0.0);
        // OpenAI: logit - count * frequency - (count > 0) * presence.
        assert_eq!(penalised(1.0, 3, 0.5, 0.25, 1.0), 1.0 - 0.75 - 0.5);
        // A prompt-only token: repetition applies, frequency and presence do not.
        assert_eq!(penalised(4.0, 0, 0.5, 0.25, 2.0), 2.0);
        // Both: repetition first, then the subtraction.
        assert_eq!(penalised(4.0, 2, 1.0, 0.5, 2.0), 2.0 - 1.0 - 1.0);
        // Negative penalties raise the logit.
        assert_eq!(penalised(1.0, 2, -1.0, -0.5, 1.0), 3.0);
    }

    #[test]
    fn counts_follow_the_sequence_incrementally() {
        let mut c = TokenCounts::default();
        // Prompt [5, 6, 5], completion [6, 7, 6].
        let tokens = [5, 6, 5, 6, 7, 6];
        c.update(&tokens[..3], 3);
        c.update(&tokens[..4], 3);
        c.update(&tokens, 3);
        c.update(&tokens, 3); // nothing new
        let ctl = LogitControls {
            frequency_penalty: 1.0,
            ..controls()
        };
        let a = c.row_adjust(2, &ctl, 3, &[1]);
        assert_eq!(a.seen, vec![(5, 0), (6, 2), (7, 1)]);
        assert_eq!(a.row, 2);
        assert!(a.masked.is_empty());
    }

    #[test]
    fn pending_tokens_count_as_completion_occurrences() {
        let a = RowAdjust {
            frequency_penalty: 1.0,
            repetition_penalty: 1.0,
            seen: vec![(5, 1), (6, 0)],
            // Row 0 of the feeding step, then a mark past its rows (id 0).
            pending: vec![6, FED_TOKEN, FED_TOKEN | 3, 7, 7],
            ..RowAdjust::default()
        };
        let r = a.resolved(&[5]);
        assert_eq!(r.seen, vec![(5, 2), (6, 1), (0, 1), (7, 2)]);
        assert!(r.pending.is_empty());
        let mut row = [0.0f32, 0.0, 0.0, 0.0, 0.0, 3.0, 3.0, 3.0];
        adjust_rows(&mut row, 8, std::slice::from_ref(&a), &[5]).unwrap();
        assert_eq!(row, [-1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 1.0]);
        // Without a penalty they change nothing.
        let unpenalised = RowAdjust {
            frequency_penalty: 0.0,
            ..a
        };
        assert!(!unpenalised.penalises());
        assert_eq!(unpenalised.resolved(&[5]).seen, unpenalised.seen);
    }

    #[test]
    fn bias_then_penalties_then_mask() {
        let mut c = TokenCounts::default();
        c.update(&[0, 1, 1], 1); // prompt [0], completion [1, 1]
        let ctl = LogitControls {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repetition_penalty: 2.0,
            logit_bias: vec![(0, -3.0), (3, 100.0)],
            min_tokens: 3,
        };
        let a = c.row_adjust(0, &ctl, 2, &[2]);
        let mut row = [1.0f32, 2.0, 5.0, -1.0, 0.5];
        adjust_logits(&mut row, &a);
        // Token 0: biased to -2, then (prompt only) doubled by repetition: -4.
        // Token 1: 2 / 2 - 2 * 0.25 - 0.5 = 0.
        // Token 2: the end id, masked (2 of 3 min_tokens so far).
        // Token 3: -1 + 100 = 99, unseen so unpenalised. Token 4 untouched.
        assert_eq!(row, [-4.0, 0.0, f32::NEG_INFINITY, 99.0, 0.5]);
        // Once min_tokens is reached the mask is gone.
        assert!(c.row_adjust(0, &ctl, 3, &[2]).masked.is_empty());
        assert_eq!(a.check(5), Ok(()));
        assert!(a.check(3).is_err());
        let twice = RowAdjust {
            bias: vec![(1, 1.0), (1, 2.0)],
            ..a
        };
        assert!(twice.check(5).unwrap_err().contains("twice"));
    }

    #[test]
    fn validation_names_the_control() {
        let err = |c: LogitControls| c.validate(10).unwrap_err();
        let field = |c: LogitControls| err(c).0;
        assert_eq!(
            field(LogitControls {
                presence_penalty: 2.5,
                ..controls()
            }),
            "presence_penalty"
        );
        assert_eq!(
            field(LogitControls {
                frequency_penalty: f32::NAN,
                ..controls()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            field(LogitControls {
                repetition_penalty: 0.0,
                ..controls()
            }),
            "repetition_penalty"
        );
        let (f, why) = err(LogitControls {
            logit_bias: vec![(10, 1.0)],
            ..controls()
        });
        assert!(f == "logit_bias" && why.contains("outside the vocabulary"));
        let (f, why) = err(LogitControls {
            logit_bias: vec![(1, 101.0)],
            ..controls()
        });
        assert!(f == "logit_bias" && why.contains("[-100, 100]"));
        assert!(controls().is_neutral() && controls().validate(10).is_ok());
        let edge = LogitControls {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            repetition_penalty: 0.5,
            logit_bias: vec![(9, -100.0)],
            min_tokens: 1,
        };
        assert!(edge.validate(10).is_ok() && !edge.is_neutral());
    }
}
