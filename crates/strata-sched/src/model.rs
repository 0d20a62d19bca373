//! The one trait the scheduler drives a model through.

use std::sync::Arc;

use strata_kernels::Backend;
use strata_kv::{HostStorage, KvPool, KvStorage};
use strata_model::{ForwardBatch, ForwardOutput, KvCache, Model};

use crate::SchedError;

/// A model that computes one [`ForwardBatch`] over the K/V in a pool of storage `S`.
///
/// `forward` must store the K/V of every token of the batch at its request's slots and
/// return, per sequence, the logits its `LogitsMode` asks for (`vocab_size` values a row).
pub trait StepModel<S: KvStorage = HostStorage> {
    fn vocab_size(&self) -> usize;

    /// Positions the model can compute (`max_position_embeddings`); `None` for no limit.
    fn context_len(&self) -> Option<usize> {
        None
    }

    fn forward(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, SchedError>;
}

impl<B: Backend, S: KvStorage> StepModel<S> for Model<B>
where
    KvPool<S>: KvCache<B>,
{
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn context_len(&self) -> Option<usize> {
        Some(self.config().max_position_embeddings)
    }

    fn forward(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, SchedError> {
        Ok(Model::forward(self, kv, batch)?)
    }
}

/// A model shared with other threads (the engine keeps its own handle for metadata).
impl<B: Backend, S: KvStorage> StepModel<S> for Arc<Model<B>>
where
    KvPool<S>: KvCache<B>,
{
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn context_len(&self) -> Option<usize> {
        Some(self.config().max_position_embeddings)
    }

    fn forward(
        &mut self,
        kv: &mut KvPool<S>,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, SchedError> {
        Ok(Model::forward(self, kv, batch)?)
    }
}
