//! bf16 GEMMs through cuBLASLt, with the algorithm chosen once per bucket of row counts.
//!
//! `cublasGemmEx` asks cuBLAS's heuristics for an algorithm on every new shape, and on an
//! H200 that costs the host 2-4 ms a call. A decode graph meets that once, at capture; an
//! eager step whose row count has not been seen before (a step that admits prompts, and
//! the KV-shared layers of such a step, which run only the decode rows and the prompts'
//! last rows) meets it in every GEMM of every layer, so the host falls behind the GPU and
//! the step takes 15-28 ms instead of ~10. Here the heuristics run once for the bucket's
//! row count (rounded up, see [`bucket`]) and every row count of the bucket runs that
//! algorithm. cuBLAS also loads a kernel at its first launch, at about the same cost, so
//! the first time a shape is met (in the server's warm-up) its buckets up to
//! [`EAGER_PLAN_ROWS`] are all planned and each run once (`docs/perf-notes.md`, "GEMM
//! algorithms chosen once per bucket of row counts"). A shape's three matrix layouts are
//! made once too; a call only sets their token count.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::{KernelError, Result};

/// The most rows planned at once the first time a shape is met (a step's token budget is
/// 2048 by default, so its buckets all fall below this).
const EAGER_PLAN_ROWS: usize = 4096;

/// The most output bytes a warm-up product may write (see [`GemmPlans::warm`]).
const WARM_OUT_BYTES: usize = 256 << 20;

/// Weights from which the decode buckets' algorithms are timed rather than taken on the
/// heuristics' word ([`GemmPlans::tune`]), the candidates timed, the runs a timing, and the
/// most rows tuned.
const TUNE_WEIGHT_BYTES: usize = 128 << 20;
const TUNE_CANDIDATES: usize = 8;
const TUNE_RUNS: usize = 3;
const TUNE_MAX_ROWS: usize = 256;

/// What cuBLASLt may use for split-k and the like (cuBLAS's own default on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// The row count whose algorithm rows `t` run: the next multiple of 8 up to 128 (the row
/// counts decode graphs are captured at, so a graph runs its own count's algorithm), of
/// 256 up to 4096, the next power of two past it.
fn bucket(t: usize) -> usize {
    if t <= 128 {
        t.next_multiple_of(8)
    } else if t <= 4096 {
        t.next_multiple_of(256)
    } else {
        t.next_power_of_two()
    }
}

/// The buckets planned together the first time a shape is met. A product split over k
/// (`parts` > 1) runs only at decode row counts (`k_parts.rs`: up to 256), so only those
/// are planned for it.
fn eager_buckets(parts: usize) -> impl Iterator<Item = usize> {
    let most = if parts > 1 { 256 } else { EAGER_PLAN_ROWS };
    (8..=128)
        .step_by(8)
        .chain((256..=EAGER_PLAN_ROWS).step_by(256))
        .filter(move |&r| r <= most)
}

/// A GEMM shape and the row count of a bucket.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    n: usize,
    k: usize,
    rows: usize,
    bf16_out: bool,
    parts: usize,
    pair: bool,
}

/// A GEMM's shape without its row count: (n, k, bf16_out, parts, pair).
type Shape = (usize, usize, bool, usize, bool);

impl PlanKey {
    fn shape(&self) -> Shape {
        (self.n, self.k, self.bf16_out, self.parts, self.pair)
    }
}

/// One product's device operands: `out (t x n) = xb (t x k) * W^T`, W row-major n x k;
/// with `parts` > 1 the product is split over k into that many equal slices, one batch
/// entry each, written as `out [t, parts, n]` (no reduction: the reader adds them). With a
/// `pair_stride`, two weights over all of k instead (`parts` is 2): the second starts
/// `pair_stride` elements past `w`, and `out [t, 2, n]` holds both products.
#[derive(Clone, Copy)]
pub(super) struct GemmOperands {
    /// The n*k bf16 weight.
    pub w: u64,
    /// The t*k bf16 token rows.
    pub xb: u64,
    /// The t*n outputs, bf16 or f32.
    pub out: u64,
    pub t: usize,
    pub k: usize,
    pub n: usize,
    pub bf16_out: bool,
    pub parts: usize,
    /// Elements from the first weight to the second of a pair (positive); 0: no pair.
    pub pair_stride: i64,
}

impl GemmOperands {
    fn shape(&self) -> Shape {
        (self.n, self.k, self.bf16_out, self.parts, self.pair())
    }

    fn pair(&self) -> bool {
        self.pair_stride != 0
    }
}

/// The cuBLASLt handle, one matmul descriptor (f32 compute and scale, the weight
/// transposed), the workspace, the algorithm of each (shape, bucket) met so far and each
/// shape's matrix layouts.
pub(super) struct GemmPlans {
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    workspace: CudaSlice<u8>,
    /// `None`: the heuristics offered nothing, the caller runs `cublasGemmEx`.
    algos: HashMap<PlanKey, Option<sys::cublasLtMatmulAlgo_t>>,
    /// Shapes whose planned algorithms have each run once (see [`GemmPlans::warm`]).
    warmed: HashSet<Shape>,
    /// The shapes whose large weights' decode plans have been timed.
    tuned: HashSet<Shape>,
    /// Made once a shape; a call sets their token count (two attribute writes) instead of
    /// making and destroying three descriptors.
    layouts: HashMap<Shape, Layouts>,
}

// SAFETY: the raw handles are only used under the backend's mutex, on its one stream.
unsafe impl Send for GemmPlans {}

/// Whether `stream` is capturing a graph (anything queued now would join it).
fn capturing(stream: &CudaStream) -> Result<bool> {
    let status = stream
        .capture_status()
        .map_err(|e| KernelError::Device(format!("reading the capture status: {e:?}")))?;
    Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

fn device(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KernelError {
    move |e| KernelError::Device(format!("{what} a GEMM timing: {e:?}"))
}

fn lt_err(what: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> KernelError {
    move |e| KernelError::Device(format!("cuBLASLt {what}: {e:?}"))
}

/// Three matrix layouts destroyed when dropped.
struct Layouts([sys::cublasLtMatrixLayout_t; 3]);

impl Layouts {
    /// Column-major `C (n x t) = W^T (n x k) * X (k x t)`, as `cublasGemmEx` is called: A
    /// is the row-major weight read as k x n, B the token rows as k x t. With `parts` > 1,
    /// a strided batch of `parts` products over consecutive k slices of A and B (same
    /// leading dimension k), part p's C at column offset p * n of rows `parts * n` long.
    /// With `pair`, a batch of two weights over all of k sharing B, C as with two parts; A's
    /// batch offset (the distance between the weights) is set by each call.
    fn new(n: usize, k: usize, t: usize, bf16_out: bool, parts: usize, pair: bool) -> Result<Self> {
        use cudarc::cublaslt::result::create_matrix_layout;
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        let out = if bf16_out {
            bf16
        } else {
            sys::cudaDataType::CUDA_R_32F
        };
        let kp = if pair { k } else { k / parts } as u64;
        let (n64, t64) = (n as u64, t as u64);
        let a = create_matrix_layout(bf16, kp, n64, k as i64).map_err(lt_err("layout"))?;
        let b = create_matrix_layout(bf16, kp, t64, k as i64);
        let b = Self::keep(b, &[a])?;
        let c = create_matrix_layout(out, n64, t64, (parts * n) as i64);
        let c = Self::keep(c, &[a, b])?;
        let made = Self([a, b, c]);
        if pair {
            made.batch(2, [(n * k) as i64, 0, n as i64])?;
        } else if parts > 1 {
            made.batch(parts, [kp as i64, kp as i64, n as i64])?;
        }
        Ok(made)
    }

    /// Makes the three layouts a strided batch of `count`, entry i at `offsets[j] * i`
    /// elements into matrix j.
    fn batch(&self, count: usize, offsets: [i64; 3]) -> Result<()> {
        use sys::cublasLtMatrixLayoutAttribute_t as Attr;
        let count = count as i32;
        for (m, off) in offsets.into_iter().enumerate() {
            self.set(
                m,
                Attr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &count,
                "batching",
            )?;
            self.set(
                m,
                Attr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &off,
                "batching",
            )?;
        }
        Ok(())
    }

    /// A pair's distance from its first weight to its second, in elements.
    fn set_pair_stride(&mut self, stride: i64) -> Result<()> {
        let attr =
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET;
        self.set(0, attr, &stride, "setting a pair's stride")
    }

    /// Sets the token count (the columns of B and C). cuBLASLt reads a layout when a
    /// matmul is queued, so the next call may change it.
    fn set_tokens(&mut self, t: usize) -> Result<()> {
        let cols = t as u64;
        let attr = sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_COLS;
        for m in 1..3 {
            self.set(m, attr, &cols, "setting the token count")?;
        }
        Ok(())
    }

    /// Sets one attribute of layout `m` (0 A, 1 B, 2 C). `T` must be the attribute's type
    /// as cuBLASLt defines it: i32 for a batch count, i64 for a batch offset, u64 for a
    /// column count.
    fn set<T: Copy>(
        &self,
        m: usize,
        attr: sys::cublasLtMatrixLayoutAttribute_t,
        value: &T,
        what: &'static str,
    ) -> Result<()> {
        // SAFETY: the layout is live while `self` is (destroyed only on drop); the value is
        // passed by address with its size, of the attribute's type (the callers').
        unsafe {
            cudarc::cublaslt::result::set_matrix_layout_attribute(
                self.0[m],
                attr,
                (value as *const T).cast(),
                std::mem::size_of::<T>(),
            )
        }
        .map_err(lt_err(what))
    }

    /// `made`, or its error once the layouts made before it are destroyed.
    fn keep(
        made: std::result::Result<
            sys::cublasLtMatrixLayout_t,
            cudarc::cublaslt::result::CublasError,
        >,
        before: &[sys::cublasLtMatrixLayout_t],
    ) -> Result<sys::cublasLtMatrixLayout_t> {
        made.map_err(|e| {
            for &l in before {
                // SAFETY: each was created above and is destroyed once.
                unsafe { sys::cublasLtMatrixLayoutDestroy(l) };
            }
            lt_err("layout")(e)
        })
    }
}

impl Drop for Layouts {
    fn drop(&mut self) {
        for &l in &self.0 {
            // SAFETY: created in `new`, destroyed once here.
            unsafe { sys::cublasLtMatrixLayoutDestroy(l) };
        }
    }
}

impl GemmPlans {
    /// `None` when the cuBLASLt library is missing (every GEMM stays on `cublasGemmEx`).
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Option<Self>> {
        // SAFETY: dlopen probe by the library's usual names.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        let handle = cudarc::cublaslt::result::create_handle().map_err(lt_err("handle"))?;
        let desc = cudarc::cublaslt::result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("matmul descriptor"))?;
        let transa = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: the attribute is an operation enum, passed by address with its size.
        unsafe {
            cudarc::cublaslt::result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transa as *const cudarc::cublas::sys::cublasOperation_t).cast(),
                std::mem::size_of::<cudarc::cublas::sys::cublasOperation_t>(),
            )
        }
        .map_err(lt_err("transposing A"))?;
        // SAFETY: cuBLASLt only uses it as scratch during a matmul on this stream.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| KernelError::Device(format!("allocating the GEMM workspace: {e:?}")))?;
        Ok(Some(Self {
            handle,
            desc,
            workspace,
            algos: HashMap::new(),
            warmed: HashSet::new(),
            tuned: HashSet::new(),
            layouts: HashMap::new(),
        }))
    }

    /// How many (shape, bucket) algorithms have been chosen.
    pub(super) fn len(&self) -> usize {
        self.algos.len()
    }

    /// The algorithm for `key`. The first time a shape is met, every bucket up to
    /// [`EAGER_PLAN_ROWS`] is planned at once (a few ms each), so that a later step at a
    /// new row count finds its plan ready; buckets past it are planned when met.
    fn algo(&mut self, key: PlanKey) -> Result<Option<sys::cublasLtMatmulAlgo_t>> {
        if let Some(a) = self.algos.get(&key) {
            return Ok(*a);
        }
        if !self.algos.keys().any(|k| k.shape() == key.shape()) {
            for rows in eager_buckets(key.parts) {
                let planned = PlanKey { rows, ..key };
                let a = self.choose(planned)?;
                self.algos.insert(planned, a);
            }
        }
        if let Some(a) = self.algos.get(&key) {
            return Ok(*a);
        }
        let a = self.choose(key)?;
        self.algos.insert(key, a);
        Ok(a)
    }

    /// cuBLASLt's first choice for `key` at its bucket's row count.
    fn choose(&self, key: PlanKey) -> Result<Option<sys::cublasLtMatmulAlgo_t>> {
        Ok(self.candidates(key, 1)?.first().copied())
    }

    /// Up to `count` of the heuristics' algorithms for `key`, best guess first.
    fn candidates(&self, key: PlanKey, count: usize) -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
        let layouts = Layouts::new(key.n, key.k, key.rows, key.bf16_out, key.parts, key.pair)?;
        let [a, b, c] = layouts.0;
        let pref = cudarc::cublaslt::result::create_matmul_pref().map_err(lt_err("preference"))?;
        let bytes = WORKSPACE_BYTES as u64;
        let mut found: Vec<sys::cublasLtMatmulHeuristicResult_t> = Vec::with_capacity(count);
        let mut returned = 0i32;
        // SAFETY: the attribute is a u64 passed by address with its size; `found` has room
        // for `count` results and cuBLASLt writes `returned` of them; `pref` is destroyed
        // once below.
        let status = unsafe {
            let set = cudarc::cublaslt::result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes as *const u64).cast(),
                std::mem::size_of::<u64>(),
            );
            let asked = set.and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    self.desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    count as i32,
                    found.as_mut_ptr(),
                    &mut returned,
                )
                .result()
            });
            let _ = cudarc::cublaslt::result::destroy_matmul_pref(pref);
            if asked.is_ok() {
                found.set_len(returned.clamp(0, count as i32) as usize);
            }
            asked
        };
        if status.is_err() {
            return Ok(Vec::new());
        }
        Ok(found
            .into_iter()
            .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|h| h.algo)
            .collect())
    }

    /// For a weight of at least [`TUNE_WEIGHT_BYTES`] (a vocabulary's output projection),
    /// the first time it is met outside a graph capture: each decode bucket's plan becomes
    /// the fastest of the heuristics' first [`TUNE_CANDIDATES`] algorithms, timed on the
    /// stream over scratch rows. The heuristics' first guess for E2B's output projection
    /// was 8% slower than the best candidate in a survey; timing the candidates took E2B's
    /// 100-sequence step on an H200 from 3.69-3.70 to 3.68 ms (`docs/perf-notes.md`,
    /// "Three decode-step changes at 65-256 rows").
    ///
    /// # Safety
    /// `g`'s weight must be as [`GemmOperands`] lists (its rows and outputs are not used).
    unsafe fn tune(
        &mut self,
        stream: &Arc<CudaStream>,
        g: GemmOperands,
        key: PlanKey,
    ) -> Result<()> {
        let shape = key.shape();
        if key.parts != 1
            || key.pair
            || key.n * key.k * 2 < TUNE_WEIGHT_BYTES
            || self.tuned.contains(&shape)
        {
            return Ok(());
        }
        if capturing(stream)? {
            return Ok(());
        }
        self.tuned.insert(shape);
        let out_bytes = if key.bf16_out { 2 } else { 4 };
        let most = TUNE_MAX_ROWS;
        let err = |e| KernelError::Device(format!("allocating GEMM tuning rows: {e:?}"));
        let x = stream.alloc::<u16>(most * key.k).map_err(err)?;
        let y = stream.alloc::<u8>(most * key.n * out_bytes).map_err(err)?;
        let timing_event = || {
            stream
                .context()
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(device("creating an event for"))
        };
        let (start, end) = (timing_event()?, timing_event()?);
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr(stream);
        for rows in eager_buckets(1).filter(|&r| r <= most) {
            let planned = PlanKey { rows, ..key };
            // `g` is of one part and no pair (checked above): scratch rows and outputs.
            let g = GemmOperands {
                xb: xp,
                out: yp,
                t: rows,
                ..g
            };
            let mut best: Option<(f32, sys::cublasLtMatmulAlgo_t)> = None;
            for algo in self.candidates(planned, TUNE_CANDIDATES)? {
                // One run to load the kernel, then the timed ones.
                if !self.matmul(stream, &algo, g)? {
                    continue;
                }
                start.record(stream).map_err(device("recording"))?;
                for _ in 0..TUNE_RUNS {
                    self.matmul(stream, &algo, g)?;
                }
                end.record(stream).map_err(device("recording"))?;
                let ms = start.elapsed_ms(&end).map_err(device("timing"))?;
                if best.is_none_or(|(b, _)| ms < b) {
                    best = Some((ms, algo));
                }
            }
            if let Some((_, algo)) = best {
                self.algos.insert(planned, Some(algo));
            }
        }
        Ok(())
    }

    /// The product with the plan of its row count's bucket on `stream`. `Ok(false)` when
    /// there is no plan for the shape or cuBLASLt refused this row count with it: the
    /// caller runs `cublasGemmEx` instead.
    ///
    /// # Safety
    /// `g`'s addresses must hold the values [`GemmOperands`] lists, alive until the GEMM
    /// has run on `stream`.
    pub(super) unsafe fn run(&mut self, stream: &Arc<CudaStream>, g: GemmOperands) -> Result<bool> {
        let key = PlanKey {
            n: g.n,
            k: g.k,
            rows: bucket(g.t),
            bf16_out: g.bf16_out,
            parts: g.parts,
            pair: g.pair(),
        };
        // Planned first: a shape's first plan plans all its buckets, which the timing
        // then replaces for the decode buckets of a large weight.
        if self.algo(key)?.is_none() {
            return Ok(false);
        }
        self.tune(stream, g, key)?;
        let Some(algo) = self.algo(key)? else {
            return Ok(false);
        };
        self.warm(stream, g, key)?;
        self.matmul(stream, &algo, g)
    }

    /// One cuBLASLt matmul with `algo`; `Ok(false)` when cuBLASLt refused it.
    ///
    /// # Safety
    /// As [`GemmPlans::run`].
    unsafe fn matmul(
        &mut self,
        stream: &Arc<CudaStream>,
        algo: &sys::cublasLtMatmulAlgo_t,
        g: GemmOperands,
    ) -> Result<bool> {
        let made = match self.layouts.entry(g.shape()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Layouts::new(g.n, g.k, g.t, g.bf16_out, g.parts, g.pair())?)
            }
        };
        made.set_tokens(g.t)?;
        if g.pair() {
            made.set_pair_stride(g.pair_stride)?;
        }
        let [a, b, c] = made.0;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (ws, _g) = self.workspace.device_ptr(stream);
        let ran = cudarc::cublaslt::result::matmul(
            self.handle,
            self.desc,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            g.w as *const c_void,
            a,
            g.xb as *const c_void,
            b,
            g.out as *const c_void,
            c,
            g.out as *mut c_void,
            c,
            algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as sys::cudaStream_t,
        );
        Ok(ran.is_ok())
    }

    /// Runs each planned bucket of `key`'s shape once, on scratch rows, the first time the
    /// shape is met outside a graph capture. cuBLAS loads a kernel the first time it runs,
    /// which costs the host about as much as the heuristics did (2-4 ms); done here, no
    /// later step at a new row count pays it. Buckets whose output would pass
    /// [`WARM_OUT_BYTES`] (the output projection's) are left to load when met.
    ///
    /// # Safety
    /// `g`'s weights must be as [`GemmOperands`] lists (its rows and outputs are not used).
    unsafe fn warm(
        &mut self,
        stream: &Arc<CudaStream>,
        g: GemmOperands,
        key: PlanKey,
    ) -> Result<()> {
        let shape = key.shape();
        if self.warmed.contains(&shape) {
            return Ok(());
        }
        if capturing(stream)? {
            // Anything run now would join the graph; the next eager call warms the shape.
            return Ok(());
        }
        self.warmed.insert(shape);
        let out_bytes = if key.bf16_out { 2 } else { 4 };
        let rows: Vec<usize> = eager_buckets(key.parts)
            .filter(|&r| r * key.parts * key.n * out_bytes <= WARM_OUT_BYTES)
            .collect();
        let Some(&most) = rows.last() else {
            return Ok(());
        };
        let err = |e| KernelError::Device(format!("allocating GEMM warm-up rows: {e:?}"));
        // The values do not matter: only the kernels' first launch does.
        let x = stream.alloc::<u16>(most * key.k).map_err(err)?;
        let y = stream
            .alloc::<u8>(most * key.parts * key.n * out_bytes)
            .map_err(err)?;
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr(stream);
        for r in rows {
            let planned = PlanKey { rows: r, ..key };
            if let Some(Some(algo)) = self.algos.get(&planned).copied() {
                let scratch = GemmOperands {
                    xb: xp,
                    out: yp,
                    t: r,
                    ..g
                };
                self.matmul(stream, &algo, scratch)?;
            }
        }
        Ok(())
    }
}

impl Drop for GemmPlans {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here, when the last clone of the backend
        // is gone. A descriptor is read when a matmul is queued, not when it runs (the
        // layouts go with `self.layouts`).
        unsafe {
            let _ = cudarc::cublaslt::result::destroy_matmul_desc(self.desc);
            let _ = cudarc::cublaslt::result::destroy_handle(self.handle);
        }
    }
}
