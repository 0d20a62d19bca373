//! LoRA adapters served by name: the table the server reads on each request, and the model
//! end that loads them (on the thread that owns the backend).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use strata_kv::KvPool;
use strata_model::{KvCache, LoraInfo, Model};
use strata_sched::MAX_ADAPTER_ID;

use crate::{EngineError, OnBackend, OnDevice, Placement, Result};

/// A loaded adapter. Requests hold it while they run, which keeps it from being unloaded
/// under them.
#[derive(Debug)]
pub struct Adapter {
    /// The id batches name it by (1 and up).
    pub id: u32,
    /// The name requests give as `model`.
    pub name: String,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Its rank, alpha and adapted modules.
    pub info: LoraInfo,
}

/// Loads and drops adapters of the engine's model, whatever its backend.
pub(crate) trait AdapterHost: Send + Sync {
    fn load(&self, id: u32, dir: &Path, max_rank: usize) -> strata_model::Result<LoraInfo>;
    fn unload(&self, id: u32) -> bool;
    /// At most `n` adapters on the backend at once.
    fn set_max_resident(&self, n: usize);
    /// Adapters loaded, on the backend, and uploads so far.
    fn stats(&self) -> strata_model::LoraStats;
}

impl<B: Placement> AdapterHost for Model<B>
where
    Model<B>: Send + Sync,
{
    fn load(&self, id: u32, dir: &Path, max_rank: usize) -> strata_model::Result<LoraInfo> {
        self.load_lora(id, dir, max_rank)
    }

    fn unload(&self, id: u32) -> bool {
        self.unload_lora(id)
    }

    fn set_max_resident(&self, n: usize) {
        self.set_max_resident_loras(n)
    }

    fn stats(&self) -> strata_model::LoraStats {
        self.lora_stats()
    }
}

/// The model behind a [`crate::LoadedModel`], as an [`AdapterHost`].
pub(crate) struct HostOf;

impl OnBackend for HostOf {
    type Output = Arc<dyn AdapterHost>;

    fn run<B: Placement>(self, placed: &OnDevice<B>) -> Self::Output
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        placed.model.clone()
    }
}

/// The adapters by name, and the limits on them.
pub(crate) struct AdapterTable {
    by_name: BTreeMap<String, Arc<Adapter>>,
    /// Adapters loaded (in host memory) at once at most (`--max-cpu-loras`).
    pub max_loras: usize,
    /// The largest rank accepted (`--max-lora-rank`).
    pub max_rank: usize,
}

/// The table, shared by the engine handle and the engine thread.
pub(crate) type SharedTable = Arc<Mutex<AdapterTable>>;

impl AdapterTable {
    pub(crate) fn new(max_loras: usize, max_rank: usize) -> Self {
        Self {
            by_name: BTreeMap::new(),
            max_loras: max_loras.min(MAX_ADAPTER_ID as usize - 1),
            max_rank,
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Adapter>> {
        self.by_name.get(name).cloned()
    }

    pub(crate) fn list(&self) -> Vec<Arc<Adapter>> {
        self.by_name.values().cloned().collect()
    }

    /// Loads `dir` as `name` through `host`: refused when the name is taken, the table is
    /// full, or the model refuses the adapter (nothing changes then).
    pub(crate) fn load(
        &mut self,
        host: &dyn AdapterHost,
        name: &str,
        dir: &Path,
        model_name: &str,
    ) -> Result<Arc<Adapter>> {
        if name.is_empty() || name == model_name {
            return Err(EngineError::Invalid(format!(
                "an adapter cannot be named {name:?} (the served model's name, or empty)"
            )));
        }
        if self.by_name.contains_key(name) {
            return Err(EngineError::Invalid(format!(
                "an adapter named {name:?} is already loaded"
            )));
        }
        if self.by_name.len() >= self.max_loras {
            return Err(EngineError::Invalid(format!(
                "{} adapters are loaded, the most --max-cpu-loras allows: unload one first",
                self.by_name.len()
            )));
        }
        let id = (1..MAX_ADAPTER_ID)
            .find(|id| self.by_name.values().all(|a| a.id != *id))
            .expect("fewer adapters than ids");
        let info = host
            .load(id, dir, self.max_rank)
            .map_err(|e| EngineError::Invalid(format!("adapter {name:?}: {e}")))?;
        let adapter = Arc::new(Adapter {
            id,
            name: name.to_string(),
            path: dir.to_path_buf(),
            info,
        });
        self.by_name.insert(name.to_string(), adapter.clone());
        Ok(adapter)
    }

    /// Unloads `name`: refused while a request holds it.
    pub(crate) fn unload(&mut self, host: &dyn AdapterHost, name: &str) -> Result<()> {
        let Some(a) = self.by_name.get(name) else {
            return Err(EngineError::NotFound(format!(
                "no adapter named {name:?} is loaded"
            )));
        };
        let users = Arc::strong_count(a) - 1;
        if users > 0 {
            return Err(EngineError::Invalid(format!(
                "adapter {name:?} is in use by {users} requests"
            )));
        }
        host.unload(a.id);
        self.by_name.remove(name);
        Ok(())
    }
}
