//! Compiling request grammars over one vocabulary, with a bounded cache.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use llguidance::{Matcher, ParserFactory, TokenParser};
use strata_sched::Constraint;

use crate::constraint::GrammarConstraint;
use crate::vocab::{Tokenize, Vocab};
use crate::Spec;

/// Compiled grammars kept for reuse: a client sending the same schema again skips its
/// compilation. Bounded because clients choose the schemas.
pub const MAX_CACHED_GRAMMARS: usize = 64;

/// Compiles [`Spec`]s into constraints over one model's vocabulary.
pub struct Grammars {
    factory: ParserFactory,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    parsers: HashMap<String, TokenParser>,
    order: VecDeque<String>,
}

impl Grammars {
    /// A compiler over `vocab`, whose tokenizer `tokenize` turns text into ids (no BOS).
    pub fn new(
        vocab: Vocab,
        tokenize: impl Fn(&[u8]) -> Vec<u32> + Send + Sync + 'static,
    ) -> Result<Self, String> {
        let tokenize: Tokenize = Arc::new(tokenize);
        let mut factory =
            ParserFactory::new_simple(&vocab.env(tokenize)).map_err(|e| e.to_string())?;
        // Warnings and errors come back to the client in the error message, not on stderr.
        factory.quiet();
        Ok(Self {
            factory,
            cache: Mutex::new(Cache::default()),
        })
    }

    /// The constraint of `spec`, or llguidance's message on why it does not compile.
    pub fn constraint(&self, spec: &Spec) -> Result<Constraint, String> {
        let key = spec.key();
        let cached = self.lock().parsers.get(&key).map(TokenParser::deep_clone);
        let parser = match cached {
            Some(p) => p,
            None => {
                let p = self
                    .factory
                    .create_parser(spec.grammar())
                    .map_err(|e| e.to_string())?;
                self.remember(key, p.deep_clone());
                p
            }
        };
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint::new(GrammarConstraint::new(matcher)))
    }

    /// Grammars in the cache.
    pub fn cached(&self) -> usize {
        self.lock().parsers.len()
    }

    fn remember(&self, key: String, parser: TokenParser) {
        let mut cache = self.lock();
        if cache.parsers.insert(key.clone(), parser).is_none() {
            cache.order.push_back(key);
        }
        while cache.order.len() > MAX_CACHED_GRAMMARS {
            if let Some(old) = cache.order.pop_front() {
                cache.parsers.remove(&old);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic elsewhere while holding the lock leaves a consistent map.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}
