//! Structured outputs: the model's vocabulary as llguidance reads it, built on first use
//! (a trie over every token's bytes, a fraction of a second at 262,144 ids) and kept.

use std::sync::{Arc, OnceLock};

use strata_sched::Constraint;
use strata_structured::{Grammars, Spec, Vocab};
use strata_tokenizer::Tokenizer;

/// The grammar compiler of one model, made when the first request asks for one.
#[derive(Clone, Default)]
pub(crate) struct LazyGrammars(Arc<OnceLock<Result<Grammars, String>>>);

impl LazyGrammars {
    /// The constraint of `spec` over `tokenizer`'s vocabulary, whose generation ends with
    /// `eos`; llguidance's message when it does not compile.
    pub fn constraint(
        &self,
        tokenizer: &Arc<Tokenizer>,
        eos: u32,
        spec: &Spec,
    ) -> Result<Constraint, String> {
        let grammars = self.0.get_or_init(|| build(tokenizer, eos));
        grammars.as_ref().map_err(Clone::clone)?.constraint(spec)
    }
}

fn build(tokenizer: &Arc<Tokenizer>, eos: u32) -> Result<Grammars, String> {
    let n = tokenizer.vocab_size();
    let mut words = Vec::with_capacity(n);
    let mut special = Vec::with_capacity(n);
    for id in 0..n as u32 {
        let text = tokenizer
            .token_bytes(id, false)
            .map_err(|e| e.to_string())?;
        // Control tokens decode to nothing: llguidance knows them by their own text.
        let is_special = text.is_empty();
        special.push(is_special);
        words.push(match is_special {
            true => tokenizer.token_bytes(id, true).map_err(|e| e.to_string())?,
            false => text,
        });
    }
    if eos as usize >= n {
        return Err(format!(
            "the end-of-sequence id {eos} is outside the vocabulary of {n}"
        ));
    }
    let tok = tokenizer.clone();
    Grammars::new(Vocab::new(words, special, eos), move |text: &[u8]| {
        tok.encode(&String::from_utf8_lossy(text), false, false)
            .unwrap_or_default()
    })
}
