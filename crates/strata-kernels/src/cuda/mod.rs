//! The CUDA backend: f32 activations in device memory, weights in F32 / BF16 / F16, kernels
//! from the repository's `kernels/*.cu` compiled at start-up by NVRTC for the GPU present
//! (cached on disk), dense matmul through cuBLAS.
//!
//! Every CUDA library is loaded at run time (cudarc's dynamic loading), so this module
//! builds everywhere; [`CudaBackend::new`] returns an error, never panics, on a machine
//! without a driver, NVRTC or cuBLAS.
//!
//! Everything runs in order on one stream: downloads wait for the work before them, and
//! buffers need no cross-stream tracking.

mod adjust;
mod attention;
mod attention_plan;
mod buffer;
mod cache;
mod conformer;
mod dense_attention;
mod fused;
mod gated_pair;
mod gemm_plans;
mod host_gaps;
mod k_parts;
mod lora;
mod matmul;
mod matmul_path;
mod memory;
mod module;
mod ops;
mod paged;
mod paged_mma;
mod picks;
mod prefill_attention;
mod quant;
mod quant_dp4a;
mod skinny_gemm;
mod small_gemm;
mod sources;

pub use crate::tuning::CudaTuning;
pub use buffer::CudaBuffer;
pub use gated_pair::PairRows;
pub use k_parts::KParts;
pub use paged::{CudaIndex, CudaKvSlab, CudaPagedBatch};
pub use picks::CudaTokens;
pub use quant::{
    BlockFormat, Bnb4Parts, CudaQuantMatrix, DEQUANT_SLICE_VALUES, QUANT_GEMV_MAX_ROWS,
};
pub use sources::{compile_cubin, nvrtc_available, nvrtc_version, KernelFile, KERNEL_FILES};

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream, LaunchConfig};

use crate::params::{
    Activation, AttentionParams, ChunkedAttentionParams, DepthwiseConv, LoraShape, LoraStacks,
    MatmulShape, ResidualStep, RmsNormParams, RopeParams, StridedCopy, TableSlice,
};
use crate::sampling::RowDraw;
use crate::{Backend, DType, HostSlice, KernelError, Result, RopeAt};
use module::Kernels;

/// A captured, instantiated CUDA graph.
pub struct CudaGraphExec(cudarc::driver::CudaGraph);

// SAFETY: the graph is only launched on the backend's one stream; cudarc's handle types
// are plain driver handles.
unsafe impl Send for CudaGraphExec {}
// SAFETY: the field is private and the only use through a shared reference is
// `CudaGraph::launch` (in `launch_graph`), which binds the context and calls
// `cuGraphLaunch` on the backend's stream; driver calls are thread-safe, and the driver
// orders launches of one executable graph behind each other.
unsafe impl Sync for CudaGraphExec {}

/// One GPU, one stream, the loaded kernels and a cuBLAS handle. Cloning shares all of them
/// (a KV storage keeps a clone to allocate its slabs).
#[derive(Clone)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// cuBLAS handles are not meant for concurrent calls from several threads.
    blas: Arc<Mutex<CudaBlas>>,
    /// cuBLASLt algorithms per bucket of row counts for the bf16 GEMMs (`None`: no
    /// cuBLASLt library, or [`CudaTuning::gemm_plans`] off).
    gemm_plans: Option<Arc<Mutex<gemm_plans::GemmPlans>>>,
    kernels: Arc<Kernels>,
    arch: u32,
    device_name: String,
    /// Dense matmuls with a BF16 weight round the activations to bf16 and run a bf16 GEMM
    /// with f32 accumulation and output (the speed path); off, the weight is widened and
    /// SGEMM keeps f32 activations exact (the reference path).
    bf16_gemm: bool,
    /// Block-quantized products over the block GEMV's rows quantize x to 8 bits and take
    /// integer dot products (`quant_dp4a.rs`) in the bf16 mode; off
    /// ([`CudaTuning::quant_dp4a`]), they decode the weight to f32 as the exact mode does.
    quant_dp4a: bool,
    /// Columns a LoRA shrink block sums, a multiple of 8
    /// ([`CudaTuning::lora_split_cols`]).
    lora_split_cols: usize,
    /// Rows up to which a block-quantized product runs as the block GEMV
    /// ([`CudaTuning::quant_gemv_max_rows`]).
    quant_gemv_max_rows: usize,
    /// Multiprocessors, read once: attention sizes its key splits from it every call.
    sm_count: usize,
    /// Row counts up to which a bf16 matmul runs as the GEMV kernel
    /// ([`CudaTuning::gemv_max_rows`]).
    gemv_max_rows: usize,
    /// Query rows from which a sequence's attention runs as a prefill (0: never), from
    /// [`CudaTuning::dense_attention_min_q`].
    dense_min_q: usize,
    /// What the device grants the tensor-core paged attention (nothing: not used).
    paged_mma: paged_mma::MmaSupport,
    /// The most rows (past the GEMV's) a bf16 product runs as `kernels/skinny_gemm.cu`
    /// rather than cuBLAS: 128 on sm_90, 32 on later GPUs, 0 before (`skinny_gemm::probe`).
    skinny_max_rows: usize,
    /// The rows at which a gated product runs as one batched GEMM over gate and up
    /// (`gated_pair.rs`).
    gated_pair: gated_pair::PairRows,
    /// The rows a product of a small weight runs as `kernels/small_gemm.cu`.
    small_rows: small_gemm::SmallRows,
    /// When a product whose reader adds parts is split over k (`k_parts.rs`).
    k_parts: k_parts::KParts,
    /// Argmax keys and their page-locked host copies, kept for the next step.
    argmax_slots: Arc<picks::ArgmaxSlots>,
    draw_scratch: Arc<picks::DrawScratches>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device_name)
            .field("arch", &format_args!("sm_{}", self.arch))
            .finish()
    }
}

fn device_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Device(format!("{what}: {e:?}"))
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

impl CudaBackend {
    /// Opens GPU `ordinal`, compiles (or loads from the cache) every kernel for its compute
    /// capability and creates the cuBLAS handle.
    pub fn new(ordinal: usize) -> Result<Self> {
        // cudarc panics when a library lacks a symbol it expects (an old driver, say);
        // that is a start-up error like any other.
        std::panic::catch_unwind(|| Self::open(ordinal)).unwrap_or_else(|p| {
            Err(KernelError::Device(format!(
                "CUDA initialisation failed: {}",
                panic_text(p.as_ref())
            )))
        })
    }

    fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: dlopen probes by the library's usual names (so too for libnvrtc and
        // libcublas below); loading it runs only the vendor library's own initialisers,
        // which any use of it runs too.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(KernelError::Device(
                "libcuda not found: no NVIDIA driver on this machine".into(),
            ));
        }
        if !sources::nvrtc_available() {
            return Err(KernelError::Device(
                "libnvrtc not found: install the CUDA toolkit (or the nvidia-cuda-nvrtc \
                 package) and put its lib directory on LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        // SAFETY: as for libcuda above.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(KernelError::Device(
                "libcublas not found: install cuBLAS and put it on LD_LIBRARY_PATH".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(device_err("opening the GPU"))?;
        // SAFETY: this backend uses a single stream, so no buffer is ever shared between
        // streams and cudarc's per-buffer events would only add work to every launch.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(device_err("creating a stream"))?;
        keep_freed_memory(&ctx);
        let (major, minor) = ctx
            .compute_capability()
            .map_err(device_err("reading the compute capability"))?;
        let arch = (major * 10 + minor) as u32;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(100, |n| n.max(1) as usize);
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| KernelError::Device(format!("creating a cuBLAS handle: {e:?}")))?;
        let tuning = CudaTuning::get();
        static LOGGED: std::sync::Once = std::sync::Once::new();
        LOGGED.call_once(|| eprintln!("strata: {}", tuning.summary()));
        let gemm_plans = if tuning.gemm_plans {
            gemm_plans::GemmPlans::new(&stream)?.map(|p| Arc::new(Mutex::new(p)))
        } else {
            None
        };
        let kernels = Kernels::load(&ctx, arch)?;
        let paged_mma = paged_mma::MmaSupport::probe(&ctx, arch, &kernels);
        let skinny_max_rows = skinny_gemm::probe(arch, &kernels, tuning.skinny_gemm_max_rows);
        Ok(Self {
            ctx,
            stream,
            blas: Arc::new(Mutex::new(blas)),
            gemm_plans,
            kernels: Arc::new(kernels),
            arch,
            device_name,
            bf16_gemm: false,
            quant_dp4a: tuning.quant_dp4a,
            quant_gemv_max_rows: tuning.quant_gemv_max_rows,
            lora_split_cols: tuning.lora_split_cols.max(1).next_multiple_of(8),
            sm_count,
            gemv_max_rows: tuning.gemv_max_rows.min(fused::GEMV_MAX_ROWS),
            dense_min_q: tuning.dense_attention_min_q,
            paged_mma,
            skinny_max_rows,
            gated_pair: gated_pair::PairRows::from_tuning(tuning),
            small_rows: small_gemm::SmallRows::from_tuning(arch, tuning),
            k_parts: k_parts::KParts::from_tuning(tuning),
            argmax_slots: Arc::default(),
            draw_scratch: Arc::default(),
        })
    }

    /// How many (GEMM shape, bucket of row counts) algorithms the bf16 GEMMs have chosen
    /// so far; `None` without cuBLASLt. (The row counts of a bucket share one.)
    pub fn gemm_plan_count(&self) -> Option<usize> {
        let plans = self.gemm_plans.as_ref()?;
        plans.lock().ok().map(|p| p.len())
    }

    /// Drops cuBLASLt's per-bucket plans: every bf16 GEMM then runs as `cublasGemmEx`, as
    /// where cuBLASLt is missing or `STRATA_GEMM_PLANS=0` is set (a pair as one call a weight, a
    /// product in parts as one call a part); returns the backend for chaining.
    pub fn without_gemm_plans(mut self) -> Self {
        self.gemm_plans = None;
        self
    }

    /// Sets the bf16 GEMM path (see the field); returns the backend for chaining.
    pub fn with_bf16_gemm(mut self, on: bool) -> Self {
        self.bf16_gemm = on;
        self
    }

    /// Whether dense matmuls with a BF16 weight run the bf16 GEMM (activations rounded to
    /// bf16) rather than the exact f32 path.
    pub fn bf16_gemm(&self) -> bool {
        self.bf16_gemm
    }

    /// Sets whether the bf16 mode's block-quantized products quantize x to 8 bits or
    /// decode the weight to f32 as the exact mode does (the default); returns the backend
    /// for chaining.
    pub fn with_quant_dp4a(mut self, on: bool) -> Self {
        self.quant_dp4a = on;
        self
    }

    /// Whether block-quantized products run on 8-bit x: the bf16 mode with
    /// [`Self::with_quant_dp4a`] on.
    pub fn quant_dp4a(&self) -> bool {
        self.bf16_gemm && self.quant_dp4a
    }

    /// Sets the row count up to which block-quantized products run as the GEMV kernel
    /// (the default is [`CudaTuning::quant_gemv_max_rows`]); returns the backend for
    /// chaining.
    pub fn with_quant_gemv_max_rows(mut self, rows: usize) -> Self {
        self.quant_gemv_max_rows = rows;
        self
    }

    /// Row count up to which block-quantized products run as the GEMV kernel.
    pub fn quant_gemv_max_rows(&self) -> usize {
        self.quant_gemv_max_rows
    }

    /// Sets the row count up to which bf16 matmuls run as the GEMV kernel (0 to 8; the
    /// default is [`CudaTuning::gemv_max_rows`]); returns the backend for chaining.
    pub fn with_gemv_max_rows(mut self, rows: usize) -> Self {
        self.gemv_max_rows = rows.min(fused::GEMV_MAX_ROWS);
        self
    }

    /// Row count up to which bf16 matmuls run as the GEMV kernel.
    pub fn gemv_max_rows(&self) -> usize {
        self.gemv_max_rows
    }

    /// Turns the few-row tensor-core GEMM off (`false`) or back on where the device runs
    /// it; returns the backend for chaining.
    pub fn with_skinny_gemm(mut self, on: bool) -> Self {
        self.skinny_max_rows = if on {
            skinny_gemm::probe(
                self.arch,
                &self.kernels,
                CudaTuning::get().skinny_gemm_max_rows,
            )
        } else {
            0
        };
        self
    }

    /// Whether bf16 products over a few rows run as the tensor-core GEMM of
    /// `kernels/skinny_gemm.cu`.
    pub fn skinny_gemm(&self) -> bool {
        self.skinny_max_rows > 0
    }

    /// Turns the small-weight GEMM (`kernels/small_gemm.cu`) off (`false`) or back on where
    /// the device runs it; returns the backend for chaining.
    pub fn with_small_gemm(mut self, on: bool) -> Self {
        self.small_rows = if on {
            small_gemm::SmallRows::from_tuning(self.arch, CudaTuning::get())
        } else {
            small_gemm::SmallRows::OFF
        };
        self
    }

    /// The rows (inclusive) over which a bf16 product of a small weight (one side at most
    /// 512) runs as the small-weight GEMM; `None` when it never does.
    pub fn small_gemm_rows(&self) -> Option<(usize, usize)> {
        let r = self.small_rows;
        (r.min <= r.max).then_some((r.min, r.max))
    }

    /// The most rows a bf16 product runs as that GEMM (0: none; cuBLAS past it).
    pub fn skinny_max_rows(&self) -> usize {
        self.skinny_max_rows
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .bind_to_thread()
            .map_err(device_err("binding the GPU context"))?;
        cudarc::driver::result::mem_get_info().map_err(device_err("reading free memory"))
    }

    /// Device-to-device copy bandwidth in bytes per second, counting bytes read and
    /// written: the best of a few copies of `bytes` (the decode roofline's denominator).
    pub fn measure_copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let n = bytes / 4;
        let src = self
            .stream
            .alloc_zeros::<f32>(n)
            .map_err(device_err("allocating a bandwidth buffer"))?;
        let mut dst = self
            .stream
            .alloc_zeros::<f32>(n)
            .map_err(device_err("allocating a bandwidth buffer"))?;
        let mut best = f64::INFINITY;
        for _ in 0..6 {
            self.synchronize()?;
            let t = std::time::Instant::now();
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(device_err("copying on the GPU"))?;
            self.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * (n * 4) as f64 / best)
    }

    /// The GPU's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Compute capability as one number (90 for sm_90).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// Waits for all queued work and reports any asynchronous device error.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(device_err("synchronizing"))
    }
}

/// Lets the device's default memory pool keep freed blocks instead of returning them to
/// the driver at each synchronisation, so the per-op stream-ordered allocations of the
/// eager forward pass are served from the pool. Best effort: a driver without pools keeps
/// its default behaviour.
fn keep_freed_memory(ctx: &Arc<CudaContext>) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver calls with valid out-pointers; failures are ignored.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
        {
            let mut threshold: u64 = u64::MAX;
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
        }
    }
}

/// A 1-D grid-stride launch over `n` elements (256 threads a block).
fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type QuantMatrix = CudaQuantMatrix;
    type KvSlab = CudaKvSlab;
    type Index = CudaIndex;
    type PagedBatch = CudaPagedBatch;
    type Graph = CudaGraphExec;
    type Tokens = CudaTokens;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn activation_dtype(&self) -> DType {
        DType::F32
    }

    fn upload(&self, data: HostSlice<'_>) -> Result<CudaBuffer> {
        self.upload_impl(data)
    }

    fn zeros(&self, len: usize, dtype: DType) -> Result<CudaBuffer> {
        self.zeros_impl(len, dtype)
    }

    fn scratch(&self, len: usize, dtype: DType) -> Result<CudaBuffer> {
        self.scratch_impl(len, dtype)
    }

    fn download(&self, buf: &CudaBuffer) -> Result<Vec<f32>> {
        self.download_impl(buf)
    }

    fn copy_strided(&self, src: &CudaBuffer, dst: &mut CudaBuffer, c: StridedCopy) -> Result<()> {
        self.copy_strided_impl(src, dst, c)
    }

    fn embedding(
        &self,
        ids: &[u32],
        table: &CudaBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.embedding_impl(ids, table, hidden, scale, out)
    }

    fn embedding_quant(
        &self,
        ids: &[u32],
        table: &CudaQuantMatrix,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.embedding_quant_host(ids, table, scale, out)
    }

    fn rms_norm(
        &self,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.rms_norm_plain(x, weight, p, out)
    }

    fn residual_norm(
        &self,
        residual: &mut CudaBuffer,
        x: &CudaBuffer,
        p: RmsNormParams,
        step: ResidualStep<'_, CudaBuffer>,
    ) -> Result<()> {
        match step {
            ResidualStep::AddThenNorm { weight, out } => {
                self.add_then_rms_norm(residual, x, weight, p, out)
            }
            ResidualStep::NormThenAdd {
                weight,
                scale,
                next: None,
            } => self.rms_norm_then_add(residual, x, weight, p, scale),
            ResidualStep::NormThenAdd {
                weight,
                scale,
                next: Some(next),
            } => self.rms_norm_add_then_norm(residual, x, weight, p, scale, next),
        }
    }

    fn rope(
        &self,
        x: &mut CudaBuffer,
        positions: &[u32],
        inv_freq: &CudaBuffer,
        p: RopeParams,
    ) -> Result<()> {
        self.rope_impl(x, positions, inv_freq, p)
    }

    fn matmul(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        shape: MatmulShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.matmul_impl(x, w, shape, out)
    }

    fn matmul_k_parts(&self, w: &CudaBuffer, shape: MatmulShape, rows: usize) -> usize {
        self.k_parts_for(w, shape, rows)
    }

    fn matmul_parts(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        shape: MatmulShape,
        parts: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.matmul_parts_impl(x, w, shape, parts, out)
    }

    fn matmul_shared_input(
        &self,
        x: &CudaBuffer,
        mats: &mut [crate::MatmulOut<'_, CudaBuffer>],
    ) -> Result<()> {
        self.matmul_shared_impl(x, mats)
    }

    fn gated_matmul(
        &self,
        act: Activation,
        x: &CudaBuffer,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        shape: MatmulShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.gated_matmul_impl(act, x, gate, up, shape, out)
    }

    fn gated_slice_matmul(
        &self,
        act: Activation,
        x: &CudaBuffer,
        gate: &CudaBuffer,
        shape: MatmulShape,
        table: &CudaBuffer,
        s: TableSlice,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.gated_slice_matmul_impl(act, x, gate, shape, table, s, out)
    }

    fn matmul_quant(
        &self,
        x: &CudaBuffer,
        w: &CudaQuantMatrix,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.matmul_quant_impl(x, w, out)
    }

    fn lora_bgmv(
        &self,
        x: &CudaBuffer,
        stacks: LoraStacks<'_, CudaBuffer>,
        slots: &CudaIndex,
        shape: LoraShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.lora_bgmv_impl(x, stacks, slots, shape, out)
    }

    fn lora_bgmv_shared_input(
        &self,
        x: &CudaBuffer,
        parts: &mut [crate::LoraOut<'_, CudaBuffer>],
        slots: &CudaIndex,
        shape: LoraShape,
    ) -> Result<()> {
        self.lora_shared_impl(x, parts, slots, shape)
    }

    fn act_mul(
        &self,
        act: Activation,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.act_mul_impl(act, gate, up, out, false)
    }

    fn activation(&self, act: Activation, x: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        self.activation_impl(act, x, out)
    }

    fn softcap(&self, x: &mut CudaBuffer, cap: f32) -> Result<()> {
        self.softcap_impl(x, cap)
    }

    fn clamp(&self, x: &mut CudaBuffer, lo: f32, hi: f32) -> Result<()> {
        self.clamp_impl(x, lo, hi)
    }

    fn depthwise_conv1d_causal(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        p: DepthwiseConv,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.depthwise_conv1d_causal_impl(x, w, p, out)
    }

    fn chunked_attention(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        rel_k: &CudaBuffer,
        p: ChunkedAttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.chunked_attention_impl(q, k, v, rel_k, p, out)
    }

    fn add(&self, acc: &mut CudaBuffer, x: &CudaBuffer) -> Result<()> {
        self.binary_impl("add", acc, x)
    }

    fn mul(&self, acc: &mut CudaBuffer, x: &CudaBuffer) -> Result<()> {
        self.binary_impl("mul", acc, x)
    }

    fn scale(&self, x: &mut CudaBuffer, s: f32) -> Result<()> {
        self.scale_impl(x, s)
    }

    fn attention(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        q_positions: &[u32],
        k_positions: &[u32],
        p: AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.attention_impl(q, k, v, q_positions, k_positions, p, out)
    }

    fn kv_slab(&self, shape: crate::KvSlabShape) -> Result<CudaKvSlab> {
        self.kv_slab_impl(shape)
    }

    fn kv_slab_contents(&self, slab: &CudaKvSlab) -> Result<crate::KvSlabContents> {
        self.kv_slab_contents_impl(slab)
    }

    fn upload_index(&self, index: &[u32]) -> Result<CudaIndex> {
        self.upload_index_impl(index)
    }

    fn kv_store(
        &self,
        slab: &mut CudaKvSlab,
        k: &CudaBuffer,
        v: &CudaBuffer,
        slots: &CudaIndex,
    ) -> Result<()> {
        self.kv_store_impl(slab, k, v, slots)
    }

    fn paged_batch(&self, seqs: &[crate::PagedSeq], slots: &[u32]) -> Result<CudaPagedBatch> {
        self.paged_batch_impl(seqs, slots)
    }

    fn paged_attention(
        &self,
        q: &CudaBuffer,
        slab: &CudaKvSlab,
        batch: &CudaPagedBatch,
        p: AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.paged_attention_impl(q, slab, batch, p, out)
    }

    fn write_index(&self, index: &mut CudaIndex, data: &[u32]) -> Result<()> {
        self.write_index_impl(index, data)
    }

    fn paged_batch_with_capacity(
        &self,
        seqs: &[crate::PagedSeq],
        slots: &[u32],
        slot_capacity: usize,
    ) -> Result<CudaPagedBatch> {
        self.paged_batch_with_capacity_impl(seqs, slots, slot_capacity)
    }

    fn paged_batch_update(
        &self,
        batch: &mut CudaPagedBatch,
        seqs: &[crate::PagedSeq],
        slots: &[u32],
    ) -> Result<()> {
        self.paged_batch_update_impl(batch, seqs, slots)
    }

    fn paged_batch_update_pages(
        &self,
        batch: &mut CudaPagedBatch,
        seqs: &[crate::PagedSeq],
        pages: &[u32],
        page_start: &[u32],
        page_size: usize,
    ) -> Result<()> {
        self.paged_batch_update_pages_impl(batch, seqs, pages, page_start, page_size)
    }

    fn embedding_idx(
        &self,
        ids: &CudaIndex,
        table: &CudaBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.embedding_dev(ids.len(), ids.data(), table, hidden, scale, out)
    }

    fn embedding_quant_idx(
        &self,
        ids: &CudaIndex,
        table: &CudaQuantMatrix,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.embedding_quant_dev(ids.len(), ids.data(), table, scale, out)
    }

    fn rope_idx(
        &self,
        x: &mut CudaBuffer,
        positions: &CudaIndex,
        inv_freq: &CudaBuffer,
        p: RopeParams,
    ) -> Result<()> {
        self.rope_dev(x, positions.len(), positions.data(), inv_freq, p)
    }

    fn head_norm_rope_parts_idx(
        &self,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        weight: Option<&CudaBuffer>,
        norm: RmsNormParams,
        at: RopeAt<'_, Self>,
        rope: RopeParams,
    ) -> Result<()> {
        self.head_norm_rope_parts_impl(x, out, weight, norm, at, rope)
    }

    fn head_norm_rope_idx(
        &self,
        x: &mut CudaBuffer,
        weight: Option<&CudaBuffer>,
        norm: RmsNormParams,
        at: RopeAt<'_, Self>,
        rope: RopeParams,
    ) -> Result<()> {
        let (n, pos) = (at.positions.len(), at.positions.data());
        self.head_norm_rope_dev(x, weight, norm, n, pos, at.inv_freq, rope)
    }

    fn qkv_norm_rope_idx(
        &self,
        qkv: [&mut CudaBuffer; 3],
        norms: [&CudaBuffer; 2],
        at: RopeAt<'_, Self>,
        p: crate::QkvPrep,
    ) -> Result<()> {
        self.qkv_norm_rope_impl(qkv, norms, at.positions, at.inv_freq, p, None)
    }

    fn qkv_norm_rope_store_idx(
        &self,
        qkv: [&mut CudaBuffer; 3],
        norms: [&CudaBuffer; 2],
        at: RopeAt<'_, Self>,
        p: crate::QkvPrep,
        (slab, slots): (&mut CudaKvSlab, &CudaIndex),
    ) -> Result<()> {
        let store = Some((slab, slots));
        self.qkv_norm_rope_impl(qkv, norms, at.positions, at.inv_freq, p, store)
    }

    fn act_mul_slice(
        &self,
        act: Activation,
        gate: &CudaBuffer,
        table: &CudaBuffer,
        s: TableSlice,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.act_mul_slice_impl(act, gate, table, s, out)
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<()> {
        use cudarc::driver::sys::CUstreamCaptureMode;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(device_err("starting a graph capture"))
    }

    fn end_capture(&self) -> Result<CudaGraphExec> {
        use cudarc::driver::sys::CUgraphInstantiate_flags;
        let g = self
            .stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(device_err("ending a graph capture"))?
            .ok_or_else(|| KernelError::Device("the capture recorded no work".into()))?;
        Ok(CudaGraphExec(g))
    }

    fn launch_graph(&self, graph: &CudaGraphExec) -> Result<()> {
        graph.0.launch().map_err(device_err("launching a graph"))
    }

    fn argmax_rows(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
    ) -> Result<Vec<u32>> {
        let tokens = self.pick_start_impl(logits, vocab, rows, softcap, &[])?;
        Ok(crate::sampling::pick_ids(&self.pick_finish_impl(tokens)?))
    }

    fn pick_start(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<CudaTokens> {
        self.pick_start_impl(logits, vocab, rows, softcap, draws)
    }

    fn pick_finish(&self, tokens: CudaTokens) -> Result<Vec<crate::sampling::Picked>> {
        self.pick_finish_impl(tokens)
    }

    fn feed_tokens(&self, ids: &mut CudaIndex, tokens: &CudaTokens) -> Result<()> {
        self.feed_tokens_impl(ids, tokens)
    }

    fn adjust_logits(
        &self,
        logits: &mut CudaBuffer,
        vocab: usize,
        rows: &[crate::sampling::RowAdjust],
        fed: Option<&CudaTokens>,
    ) -> Result<()> {
        self.adjust_logits_impl(logits, vocab, rows, fed)
    }

    fn mask_logits(
        &self,
        logits: &mut CudaBuffer,
        vocab: usize,
        rows: &[crate::sampling::RowMask],
    ) -> Result<()> {
        self.mask_logits_impl(logits, vocab, rows)
    }

    fn clustered_argmax(
        &self,
        logits: &CudaBuffer,
        scores: &CudaBuffer,
        ordering: &CudaIndex,
        c: crate::ClusterPick,
        out: &mut CudaIndex,
    ) -> Result<()> {
        self.clustered_argmax_impl(logits, scores, ordering, c, out)
    }

    fn download_index(&self, index: &CudaIndex) -> Result<Vec<u32>> {
        let len = index.len();
        if len == 0 {
            return Ok(vec![]);
        }
        self.stream
            .clone_dtoh(&index.data().slice(..len))
            .map_err(device_err("download_index"))
    }
}
