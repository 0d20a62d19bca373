//! Continuous batching for Strata.
//!
//! [`Scheduler`] owns a model (anything implementing [`StepModel`]) and its KV pool. Callers
//! [`submit`](Scheduler::submit) [`Request`]s, call [`step`](Scheduler::step) in a loop while
//! [`has_work`](Scheduler::has_work), and forward the [`Event`]s (tokens, then one
//! `Finished`) to their clients; [`cancel`](Scheduler::cancel) ends a request early.
//!
//! Admission goes through the radix prefix cache (matched whole pages are reused, only the
//! rest is allocated); prompts are computed in chunks under a per-step token budget; when
//! pages run out, cached prefixes are evicted, then the youngest running request is
//! preempted and later recomputed, never reported twice. There is no device code here.

// A request must never take the server down: failures here are errors, not panics.
#![warn(clippy::unwrap_used)]

mod admission;
mod config;
mod constraint;
mod error;
mod event;
mod lookup;
mod model;
mod overlap;
mod request;
mod reserve;
mod scheduler;
mod seq;
mod speculate;
mod step;

pub use config::SchedulerConfig;
pub use constraint::{masks_ahead_of, Constraint, TokenConstraint};
pub use error::SchedError;
pub use event::{Event, EventKind, FinishReason};
pub use lookup::PromptLookup;
pub use model::{CheckRow, CheckedRow, DraftMasks, DraftRow, StepModel};
pub use request::{MediaInput, Request, SeqId, StopFn, MAX_ADAPTER_ID};
pub use scheduler::{LaunchShape, MaskStats, SchedStatus, Scheduler};
pub use speculate::DraftStats;
