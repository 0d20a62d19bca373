//! The one place that names the backends. A model is placed on the CPU or on a GPU, with
//! its drafter (when loaded) on the same device; work that is generic over the backend
//! implements [`OnBackend`] and runs on whichever the model sits on through
//! [`Runtime::dispatch`].

use std::path::Path;
use std::sync::Arc;

use strata_config::ModelConfig;
use strata_kernels::cpu::CpuBackend;
#[cfg(feature = "cuda")]
use strata_kernels::cuda::CudaBackend;
use strata_kernels::Backend;
use strata_kv::{CacheType, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{Assistant, KvCache, LoadOptions, Model};

/// A backend a model can be placed on, with the storage its KV pools live in.
pub trait Placement: strata_model::QuantUpload + Clone + 'static {
    /// Host memory on the CPU; device slabs on a GPU.
    type Storage: KvStorage + Send + 'static;

    /// Storage for a new KV pool of `model`.
    fn kv_storage(model: &Model<Self>) -> Self::Storage;

    /// Memory free for more weights: available host memory, or free device memory.
    fn free_memory(model: &Model<Self>) -> Option<u64>;

    /// Drops the graphs `storage` captured (after a weight update).
    fn forget_graphs(storage: &mut Self::Storage);

    /// The CPU backend whose worker threads a loop of steps should run on
    /// ([`CpuBackend::run_on_workers`]); `None` where the calling thread drives the device.
    fn host_workers(&self) -> Option<CpuBackend> {
        None
    }
}

impl Placement for CpuBackend {
    type Storage = strata_model::PagedStorage<CpuBackend>;

    fn kv_storage(model: &Model<Self>) -> Self::Storage {
        strata_model::PagedStorage::new(model.backend().clone())
    }

    fn free_memory(_: &Model<Self>) -> Option<u64> {
        crate::budget::available_host_memory()
    }

    fn forget_graphs(storage: &mut Self::Storage) {
        storage.forget_graphs();
    }

    fn host_workers(&self) -> Option<CpuBackend> {
        Some(self.clone())
    }
}

#[cfg(feature = "cuda")]
impl Placement for CudaBackend {
    type Storage = strata_model::PagedStorage<CudaBackend>;

    fn kv_storage(model: &Model<Self>) -> Self::Storage {
        strata_model::PagedStorage::new(model.backend().clone())
    }

    fn free_memory(model: &Model<Self>) -> Option<u64> {
        model
            .backend()
            .memory_info()
            .ok()
            .map(|(free, _)| free as u64)
    }

    fn forget_graphs(storage: &mut Self::Storage) {
        storage.forget_graphs();
    }
}

/// A model on one backend, and its drafter on the same one.
pub struct OnDevice<B: Backend> {
    /// The model.
    pub model: Arc<Model<B>>,
    /// The drafter for speculative decoding, once [`crate::LoadedModel::load_draft`] loaded
    /// one.
    pub draft: Option<Arc<Assistant<B>>>,
}

impl<B: Backend> Clone for OnDevice<B> {
    fn clone(&self) -> Self {
        Self {
            model: self.model.clone(),
            draft: self.draft.clone(),
        }
    }
}

impl<B: Placement> OnDevice<B> {
    fn new(model: Model<B>) -> Self {
        Self {
            model: Arc::new(model),
            draft: None,
        }
    }

    /// A new, empty KV pool's storage on this device.
    pub fn kv_storage(&self) -> B::Storage {
        B::kv_storage(&self.model)
    }

    fn load_draft(&mut self, path: &Path, opts: LoadOptions) -> crate::Result<()> {
        let m = &self.model;
        let d = Assistant::load(m.backend().clone(), path, m.config(), opts)?;
        self.draft = Some(Arc::new(d));
        Ok(())
    }
}

/// Work generic over the backend, run on the model's own by [`Runtime::dispatch`].
pub trait OnBackend {
    /// What the work returns.
    type Output;

    /// Does the work on `placed`, whichever backend it is on.
    fn run<B: Placement>(self, placed: &OnDevice<B>) -> Self::Output
    where
        KvPool<B::Storage>: KvCache<B>;
}

/// Work on a KV pool of its own (no prefix cache), as `generate`, `score` and the
/// benchmarks run: [`OwnPool`] makes the pool on the model's backend.
pub(crate) trait OnOwnPool {
    type Output;

    fn run<B: Placement>(
        self,
        placed: &OnDevice<B>,
        kv: KvPool<B::Storage>,
    ) -> crate::Result<Self::Output>
    where
        KvPool<B::Storage>: KvCache<B>;
}

/// `job` on a fresh pool of `layout` and `plan`.
pub(crate) struct OwnPool<J> {
    pub layout: KvLayout,
    pub plan: PagePlan,
    pub job: J,
}

impl<J: OnOwnPool> OnBackend for OwnPool<J> {
    type Output = crate::Result<J::Output>;

    fn run<B: Placement>(self, placed: &OnDevice<B>) -> Self::Output
    where
        KvPool<B::Storage>: KvCache<B>,
    {
        let kv = KvPool::new(
            self.layout,
            self.plan,
            CacheType::Naive,
            placed.kv_storage(),
        )?;
        self.job.run(placed, kv)
    }
}

/// The model on the backend it runs on.
#[derive(Clone)]
pub enum Runtime {
    /// On the CPU.
    Cpu(OnDevice<CpuBackend>),
    /// On a GPU through CUDA.
    #[cfg(feature = "cuda")]
    Cuda(OnDevice<CudaBackend>),
}

impl Runtime {
    pub(crate) fn cpu(model: Model<CpuBackend>) -> Self {
        Runtime::Cpu(OnDevice::new(model))
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(model: Model<CudaBackend>) -> Self {
        Runtime::Cuda(OnDevice::new(model))
    }

    /// Runs `work`, a loop of steps on this thread's behalf, where the backend's ops start
    /// cheapest: on the CPU backend's worker threads ([`CpuBackend::run_on_workers`]), on
    /// this thread otherwise.
    pub fn on_workers<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        match self {
            Runtime::Cpu(p) => p.model.backend().run_on_workers(work),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(_) => work(),
        }
    }

    /// Runs `job` on the backend the model sits on.
    pub fn dispatch<J: OnBackend>(&self, job: J) -> J::Output {
        match self {
            Runtime::Cpu(p) => job.run(p),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => job.run(p),
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Runtime::Cpu(p) => p.model.config(),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.model.config(),
        }
    }

    /// Loads a drafter beside the model, on its device.
    pub(crate) fn load_draft(&mut self, path: &Path, opts: LoadOptions) -> crate::Result<()> {
        match self {
            Runtime::Cpu(p) => p.load_draft(path, opts),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.load_draft(path, opts),
        }
    }

    /// Whether the model runs on a GPU.
    pub fn on_gpu(&self) -> bool {
        !matches!(self, Runtime::Cpu(_))
    }

    /// Whether a drafter is loaded.
    pub fn has_draft(&self) -> bool {
        match self {
            Runtime::Cpu(p) => p.draft.is_some(),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.draft.is_some(),
        }
    }

    /// "cpu", or the GPU's name.
    pub fn device_name(&self) -> String {
        match self {
            Runtime::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => format!("cuda ({})", p.model.backend().device_name()),
        }
    }

    /// See `Model::kv_shared_trimmed_layers`.
    pub fn kv_shared_trimmed_layers(&self) -> usize {
        match self {
            Runtime::Cpu(p) => p.model.kv_shared_trimmed_layers(),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.model.kv_shared_trimmed_layers(),
        }
    }

    /// Free device memory in bytes (GPU only).
    pub fn free_device_memory(&self) -> Option<u64> {
        match self {
            Runtime::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.model.backend().memory_info().ok().map(|(f, _)| f as u64),
        }
    }

    /// Bytes of the backend's memory the weight matrices take (GGUF blocks at their own
    /// size; host-resident tables and the small vectors not counted).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Runtime::Cpu(p) => p.model.weight_bytes().0,
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => p.model.weight_bytes().0,
        }
    }

    /// What bounds a decode step from below: the bytes of matmul weights it reads, and on
    /// a GPU the device's measured copy bandwidth (bytes/s) and its free memory.
    pub fn decode_roofline(&self) -> crate::Result<(f64, Option<f64>, Option<u64>)> {
        match self {
            Runtime::Cpu(p) => Ok((p.model.weight_bytes().1 as f64, None, None)),
            #[cfg(feature = "cuda")]
            Runtime::Cuda(p) => {
                let b = p.model.backend();
                // The exact mode widens dense weights to f32 before its GEMMs.
                let bytes = if b.bf16_gemm() {
                    p.model.weight_bytes().1 as f64
                } else {
                    p.model.matmul_elements() as f64 * 4.0
                };
                let bw = b.measure_copy_bandwidth(2 << 30)?;
                let free = b.memory_info()?.0 as u64;
                Ok((bytes, Some(bw), Some(free)))
            }
        }
    }
}
