//! An llguidance matcher as the scheduler's token constraint.

use llguidance::Matcher;
use strata_sched::{masks_ahead_of, TokenConstraint};

/// One request's grammar state: the tokens it may draw next.
pub struct GrammarConstraint {
    matcher: Matcher,
    /// Tokens the matcher has consumed (what a rollback may give back).
    taken: usize,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher) -> Self {
        Self { matcher, taken: 0 }
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        // Once the grammar is complete only the end of sequence is allowed.
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("grammar: {e}"))?;
        let mut any = false;
        // A model's rows may outnumber its tokenizer's ids (vocabularies padded to a
        // multiple): ids past the grammar's vocabulary are never allowed.
        let known = allowed.len();
        for (id, l) in logits.iter_mut().enumerate() {
            if id < known && allowed.is_allowed(id as u32) {
                any |= *l != f32::NEG_INFINITY;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if any {
            Ok(())
        } else {
            Err("the grammar allows no token the model can produce".into())
        }
    }

    fn allowed(&mut self, vocab: usize) -> Result<Vec<u32>, String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("grammar: {e}"))?;
        let mut words = vec![0u32; vocab.div_ceil(32)];
        // Ids past the grammar's vocabulary (rows of a padded vocabulary) stay disallowed.
        let known = allowed.len().min(vocab);
        allowed.iter_set_entries(|t| {
            if t < known {
                words[t / 32] |= 1 << (t % 32);
            }
        });
        if words.iter().all(|&w| w == 0) {
            return Err("the grammar allows no token the model can produce".into());
        }
        Ok(words)
    }

    fn commit(&mut self, token: u32) -> Result<bool, String> {
        if self.matcher.is_stopped() {
            // The end of sequence after a complete grammar: nothing left to check.
            return Ok(true);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("grammar: {e}"))?;
        self.taken += 1;
        Ok(self.matcher.is_stopped())
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(Self {
            matcher: self.matcher.deep_clone(),
            taken: self.taken,
        })
    }

    /// Takes the accepted drafts and gives them back (the matcher keeps its history for
    /// that), which costs less than a deep copy of the parser each round.
    fn masks_ahead(&mut self, drafts: &[u32], vocab: usize) -> Result<Vec<Vec<u32>>, String> {
        let before = self.taken;
        let masks = masks_ahead_of(self, drafts, vocab);
        let back = self.taken - before;
        self.taken = before;
        self.matcher
            .rollback(back)
            .map_err(|e| format!("grammar: {e}"))?;
        masks
    }
}
