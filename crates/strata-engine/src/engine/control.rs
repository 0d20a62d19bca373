//! What the engine thread does to the model it serves besides running steps: load and drop
//! LoRA adapters, and replace the weights (load a second copy beside the served one, then
//! swap between steps). Built where the backend is known (`SpawnWorker`), used through
//! a trait object by the worker, which is generic over its step model only.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;

use strata_kv::KvPool;
use strata_model::{LoadOptions, Model, SwapModel};

use super::adapters::AdapterHost;
use crate::{EngineError, Placement, Result};

/// A model loaded from a new checkpoint, not yet served (its backend's type erased).
pub(crate) struct NewWeights(Box<dyn Any + Send>);

/// The engine thread's handle on its step model `M` over a pool of storage `S`.
pub(crate) trait ModelControl<M, S: strata_kv::KvStorage>: Send {
    /// The served model, to load adapters into.
    fn host<'a>(&self, m: &'a M) -> &'a dyn AdapterHost;
    /// Bytes the served weights take, and the memory free for a second copy (`None` when
    /// it cannot be read).
    fn memory(&self, m: &M) -> (usize, Option<u64>);
    /// Loads the checkpoint at `dir` on a thread of its own (steps go on meanwhile) and
    /// hands it to `done`, refused unless its shapes are the served model's.
    fn load_copy(&self, m: &M, dir: PathBuf, done: Box<dyn FnOnce(Result<NewWeights>) + Send>);
    /// Serves `new` from the next step: it takes the adapters, the captured graphs (which
    /// hold the old weights' addresses) are dropped, and so is the prefix cache.
    fn swap(&self, m: &mut M, pool: &mut KvPool<S>, new: NewWeights) -> Result<()>;
}

/// [`ModelControl`] for a model on backend `B`, loading new weights as the first were.
pub(crate) struct Control<B> {
    pub opts: LoadOptions,
    pub _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B, M> ModelControl<M, B::Storage> for Control<B>
where
    B: Placement,
    M: SwapModel<B>,
    Model<B>: Send + Sync,
{
    fn host<'a>(&self, m: &'a M) -> &'a dyn AdapterHost {
        &**m.target_model()
    }

    fn memory(&self, m: &M) -> (usize, Option<u64>) {
        let model = m.target_model();
        (model.weight_bytes().0, B::free_memory(model))
    }

    fn load_copy(&self, m: &M, dir: PathBuf, done: Box<dyn FnOnce(Result<NewWeights>) + Send>) {
        let served = m.target_model().clone();
        let opts = self.opts.clone();
        let spawned = std::thread::Builder::new()
            .name("strata-weights".into())
            .spawn(move || {
                // What the caller named cannot be served: a 400, the old weights stay.
                let loaded = Model::load_with(served.backend().clone(), &dir, opts)
                    .and_then(|new| {
                        served.check_same_shapes(&new)?;
                        Ok(NewWeights(Box::new(new)))
                    })
                    .map_err(|e| EngineError::Invalid(format!("{}: {e}", dir.display())));
                done(loaded);
            });
        if let Err(e) = spawned {
            eprintln!("[strata] cannot start the weight loader: {e}");
        }
    }

    fn swap(&self, m: &mut M, pool: &mut KvPool<B::Storage>, new: NewWeights) -> Result<()> {
        let new = new
            .0
            .downcast::<Model<B>>()
            .map_err(|_| EngineError::Internal("new weights for another backend".into()))?;
        new.adopt_loras(m.target_model());
        m.set_target_model(Arc::new(*new));
        B::forget_graphs(pool.storage_mut());
        pool.flush_cache();
        Ok(())
    }
}
