//! Structured outputs: what a request may generate, as a JSON Schema, a regular expression,
//! a list of choices or a Lark grammar, compiled with [llguidance] over a model's vocabulary
//! into a [`strata_sched::Constraint`] that masks each draw.
//!
//! ```
//! use strata_structured::{Grammars, Spec, Vocab};
//!
//! // A byte-level vocabulary: ids 0..256 are the bytes, 256 is the end of sequence.
//! let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
//! words.push(b"</s>".to_vec());
//! let vocab = Vocab::new(words, vec![false; 256].into_iter().chain([true]).collect(), 256);
//! let grammars = Grammars::new(vocab, |text: &[u8]| text.iter().map(|&b| b as u32).collect())
//!     .unwrap();
//! let mut c = grammars.constraint(&Spec::Choice(vec!["yes".into(), "no".into()])).unwrap();
//! let mut logits = vec![0.0f32; 257];
//! c.0.mask(&mut logits).unwrap();
//! assert!(logits[b'y' as usize] == 0.0 && logits[b'x' as usize] == f32::NEG_INFINITY);
//! ```

mod compile;
mod constraint;
mod spec;
mod vocab;

pub use compile::{Grammars, MAX_CACHED_GRAMMARS};
pub use constraint::GrammarConstraint;
pub use spec::Spec;
pub use vocab::Vocab;
