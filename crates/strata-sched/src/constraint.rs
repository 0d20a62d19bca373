//! Constraints on what a request may generate (a grammar, a JSON Schema): the scheduler
//! masks a constrained request's logits before each draw and tells the constraint each
//! token drawn. The constraint itself lives elsewhere (`strata-structured` builds one with
//! llguidance); the scheduler only needs this trait.

use std::fmt;

/// A request's token constraint, asked before each of its draws.
pub trait TokenConstraint: Send {
    /// Sets the logit of every token not allowed next to negative infinity.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// The tokens allowed next as bits (bit `t % 32` of word `t / 32`), for a model of
    /// `vocab` rows: what [`TokenConstraint::mask`] keeps, for a device to apply.
    fn allowed(&mut self, vocab: usize) -> Result<Vec<u32>, String>;
    /// Records the token drawn; `Ok(true)` when the constraint is complete (nothing more
    /// may follow), which ends the request with `FinishReason::Stop`.
    fn commit(&mut self, token: u32) -> Result<bool, String>;
    /// An independent copy in the same state (a sample of its own, a retried request).
    fn fork(&self) -> Box<dyn TokenConstraint>;

    /// The masks (as [`TokenConstraint::allowed`]) of a speculative round's checked rows:
    /// the next token's, then the one after each leading draft the constraint accepts,
    /// stopping after the first draft it refuses or that completes it (the rows after
    /// those can never be kept). The constraint is left as it was. The default works on
    /// a fork; a constraint that can take tokens back may do without one.
    fn masks_ahead(&mut self, drafts: &[u32], vocab: usize) -> Result<Vec<Vec<u32>>, String> {
        masks_ahead_of(self.fork().as_mut(), drafts, vocab)
    }
}

/// [`TokenConstraint::masks_ahead`] on `c`, committing the accepted drafts to it.
pub fn masks_ahead_of(
    c: &mut dyn TokenConstraint,
    drafts: &[u32],
    vocab: usize,
) -> Result<Vec<Vec<u32>>, String> {
    let mut masks = Vec::with_capacity(drafts.len() + 1);
    for j in 0..=drafts.len() {
        let allowed = c.allowed(vocab)?;
        let accepted = drafts.get(j).filter(|&&t| allows(&allowed, t));
        masks.push(allowed);
        match accepted {
            Some(&t) if !c.commit(t)? => {}
            _ => break,
        }
    }
    Ok(masks)
}

/// Whether bit `t` of `allowed` is set.
fn allows(allowed: &[u32], t: u32) -> bool {
    allowed
        .get(t as usize / 32)
        .is_some_and(|w| (w >> (t % 32)) & 1 == 1)
}

/// A boxed [`TokenConstraint`]; cloning forks it.
pub struct Constraint(pub Box<dyn TokenConstraint>);

impl Constraint {
    /// Wraps a constraint.
    pub fn new(c: impl TokenConstraint + 'static) -> Self {
        Self(Box::new(c))
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self(self.0.fork())
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}
