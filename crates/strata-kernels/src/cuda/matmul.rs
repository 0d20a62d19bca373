//! Dense matmul and the CUDA form of a quantized weight. A bf16 weight takes the GEMV for
//! one or two rows (`fused.rs`); in the bf16 mode, the few-row tensor-core GEMM for 3 to 32
//! rows (`skinny_gemm.rs`) and a bf16 cuBLAS GEMM past that. Otherwise (the exact path)
//! the activations stay f32 and, since cuBLAS has no f32 x bf16 product, a BF16 / F16
//! weight is first widened exactly to an f32 scratch matrix for SGEMM. Block-quantized
//! weights have their own products (`quant.rs`).

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::CudaSlice;

use super::buffer::{CudaBuffer, Storage};
use super::matmul_path::{Form, MatmulPath};
use super::skinny_gemm::SkinnyMat;
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::{
    Activation, Backend, DType, DeviceBuffer, KernelError, MatmulOut, MatmulShape, Result,
};

fn as_c_int(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Invalid {
        op,
        detail: format!("dimension {v} exceeds cuBLAS's 32-bit sizes"),
    })
}

/// A bf16 GEMM operand: borrowed from the activation's twin or narrowed for this call.
pub(super) enum Bf16Operand<'a> {
    Twin(&'a CudaSlice<u16>),
    Narrowed(CudaSlice<u16>),
}

impl std::ops::Deref for Bf16Operand<'_> {
    type Target = CudaSlice<u16>;
    fn deref(&self) -> &CudaSlice<u16> {
        match self {
            Self::Twin(s) => s,
            Self::Narrowed(s) => s,
        }
    }
}

/// Checks `out [t, n] = x [t, k] * W^T` and returns t.
fn matmul_rows(
    op: &'static str,
    x: &CudaBuffer,
    w: &CudaBuffer,
    shape: MatmulShape,
    out: &CudaBuffer,
) -> Result<usize> {
    matmul_rows_in_parts(op, x, w, shape, 1, out)
}

/// As [`matmul_rows`] for a product split over k, `out [t, parts, n]`.
fn matmul_rows_in_parts(
    op: &'static str,
    x: &CudaBuffer,
    w: &CudaBuffer,
    shape: MatmulShape,
    parts: usize,
    out: &CudaBuffer,
) -> Result<usize> {
    let (k, n) = (shape.in_features, shape.out_features);
    ensure(w.len() == n * k, op, || {
        format!("weight has {}, want {n} x {k}", w.len())
    })?;
    product_rows(op, x, k, out, parts * n)
}

/// Checks that `x` holds whole rows of `k` values and `out` `cols` values for each of them;
/// returns the rows.
pub(super) fn product_rows(
    op: &'static str,
    x: &CudaBuffer,
    k: usize,
    out: &CudaBuffer,
    cols: usize,
) -> Result<usize> {
    ensure(k > 0 && x.len().is_multiple_of(k), op, || {
        format!("x of {} is not rows of {k}", x.len())
    })?;
    let t = x.len() / k;
    ensure(out.len() == t * cols, op, || {
        format!("out has {}, want {t} x {cols}", out.len())
    })?;
    Ok(t)
}

impl CudaBackend {
    pub(super) fn matmul_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        shape: MatmulShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (k, n) = (shape.in_features, shape.out_features);
        let t = matmul_rows(OP, x, w, shape, out)?;
        if t == 0 || n == 0 {
            return Ok(());
        }
        // The bf16 paths may read x's bf16 twin alone (an activation held only in bf16).
        match self.matmul_path(Form::Single, w.dtype() == DType::BF16, (t, k, n)) {
            MatmulPath::Gemv => return self.gemv_bf16(x.f32s(OP)?, w, t, k, n, out),
            MatmulPath::SmallGemm => {
                let xb = self.bf16_operand(x, t * k)?;
                let (w, y) = (
                    super::fused::buffer_ptr(self, w),
                    super::fused::f32_ptr_mut(self, out, OP)?,
                );
                return self.small_gemm_launch(
                    &xb,
                    w,
                    (t, k, n),
                    y,
                    0,
                    super::small_gemm::SmallOut::Plain,
                );
            }
            MatmulPath::Skinny => {
                let xb = self.bf16_operand(x, t * k)?;
                let mat = SkinnyMat {
                    w: super::fused::buffer_ptr(self, w),
                    n,
                    y: super::fused::f32_ptr_mut(self, out, OP)?,
                    yb: 0,
                };
                return self.skinny_launch(&xb, t, k, &[mat], super::fused::GemvOut::Plain);
            }
            MatmulPath::GemmBf16 => {
                let xb = self.bf16_operand(x, t * k)?;
                return self.gemm_bf16(&xb, w, t, k, n, out);
            }
            MatmulPath::Sgemm => {}
            p @ (MatmulPath::GatedPair | MatmulPath::Separate) => {
                unreachable!("{p:?} for one weight")
            }
        }
        let xs = x.f32s(OP)?;
        let os = out.f32s_mut(OP)?;
        let widened: CudaSlice<f32>;
        let ws: &CudaSlice<f32> = match &w.storage {
            Storage::F32(s) => s,
            Storage::Bits16(_) => {
                // SAFETY: every element is written by the widening kernel before the GEMM.
                let mut scratch = unsafe { self.stream.alloc::<f32>(w.len()) }
                    .map_err(device_err("allocating matmul scratch"))?;
                self.widen_into(w, &mut scratch)?;
                widened = scratch;
                &widened
            }
        };
        // Row-major out[t, n] = x[t, k] * W[n, k]^T is, column-major, out^T = W^T * x^T:
        // A = W viewed as a k x n column-major matrix (transposed), B = x as k x t.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: as_c_int(OP, n)?,
            n: as_c_int(OP, t)?,
            k: as_c_int(OP, k)?,
            alpha: 1.0f32,
            lda: as_c_int(OP, k)?,
            ldb: as_c_int(OP, k)?,
            beta: 0.0f32,
            ldc: as_c_int(OP, n)?,
        };
        self.ctx
            .bind_to_thread()
            .map_err(device_err("binding the GPU context"))?;
        let blas = self
            .blas
            .lock()
            .map_err(|_| KernelError::Device("the cuBLAS handle's lock is poisoned".into()))?;
        super::host_gaps::mark("cublasSgemm");
        // SAFETY: the three matrices hold n*k, t*k and t*n elements (checked above); the
        // slices may be one element longer (empty-buffer placeholder), which cuBLAS ignores.
        // The handle runs on the backend's stream, so the GEMM is ordered after the writes
        // of its inputs.
        unsafe { blas.gemm(cfg, ws, &xs.slice(..t * k), os) }
            .map_err(|e| KernelError::Device(format!("{OP}: cuBLAS SGEMM: {e:?}")))?;
        super::host_gaps::mark("cublasSgemm-returned");
        Ok(())
    }
}

/// The element type a bf16 GEMM writes.
#[derive(Clone, Copy)]
pub(super) enum GemmOut {
    F32,
    Bf16,
}

impl CudaBackend {
    /// Whether a matmul over `rows` rows of an activation reads it as a bf16 GEMM operand
    /// (the bf16 mode past the GEMV's rows): the op producing the activation then writes
    /// its bf16 twin too.
    pub(super) fn gemm_reads_bf16(&self, rows: usize) -> bool {
        self.bf16_gemm && rows > self.gemv_max_rows
    }

    /// The first `len` values of the f32 activation `x` in bf16 (a GEMM's activation
    /// operand): the twin its producer wrote, else a narrowed copy.
    pub(super) fn bf16_operand<'a>(
        &self,
        x: &'a CudaBuffer,
        len: usize,
    ) -> Result<Bf16Operand<'a>> {
        if let Some(twin) = x.current_twin() {
            return Ok(Bf16Operand::Twin(twin));
        }
        Ok(Bf16Operand::Narrowed(
            self.narrow_to_bf16(x.f32s("matmul")?, len)?,
        ))
    }

    /// The first `len` values of `xs` rounded to bf16 (the GEMM's activation operand).
    fn narrow_to_bf16(&self, xs: &CudaSlice<f32>, len: usize) -> Result<CudaSlice<u16>> {
        use cudarc::driver::PushKernelArg;
        // SAFETY: every element is written by the narrowing kernel before the GEMM reads it.
        let mut xb = unsafe { self.stream.alloc::<u16>(len) }
            .map_err(device_err("allocating matmul scratch"))?;
        let n_x = len as u64;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("narrow_to_bf16")?);
        l.arg(xs).arg(&mut xb).arg(&n_x);
        // SAFETY: xs holds at least `len` elements (checked by the callers), xb exactly len.
        unsafe { l.launch(super::grid_for(len)) }.map_err(device_err("narrow_to_bf16"))?;
        Ok(xb)
    }

    /// `out [t, n] = xb [t, k] * W^T` for bf16 `xb` and `W`, f32 accumulation and output.
    fn gemm_bf16(
        &self,
        xb: &CudaSlice<u16>,
        w: &CudaBuffer,
        t: usize,
        k: usize,
        n: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        let os = out.f32s_mut("matmul")?;
        let (op, _g) = os.device_ptr_mut(&self.stream);
        // SAFETY: `out` holds t*n f32 values (checked by the callers).
        unsafe { self.gemm_bf16_to(xb, w, (t, k, n), 1, op, GemmOut::F32) }
    }

    /// `out [t, n] = xb [t, k] * W^T` rounded to bf16 (f32 accumulation).
    fn gemm_bf16_out_bf16(
        &self,
        xb: &CudaSlice<u16>,
        w: &CudaBuffer,
        t: usize,
        k: usize,
        n: usize,
        out: &mut CudaSlice<u16>,
    ) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        ensure(out.len() >= t * n, "matmul", || {
            format!("{} bf16 outputs for {t} x {n}", out.len())
        })?;
        let (op, _g) = out.device_ptr_mut(&self.stream);
        // SAFETY: `out` holds t*n values (checked above).
        unsafe { self.gemm_bf16_to(xb, w, (t, k, n), 1, op, GemmOut::Bf16) }
    }

    /// [`crate::Backend::matmul_parts`]: a bf16 weight's product over `parts` k slices as
    /// one batched GEMM (x rounded to bf16, as the bf16 mode's GEMMs do).
    pub(super) fn matmul_parts_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        shape: MatmulShape,
        parts: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        const OP: &str = "matmul_parts";
        if parts == 1 {
            return self.matmul_impl(x, w, shape, out);
        }
        let (k, n) = (shape.in_features, shape.out_features);
        ensure(
            parts > 1 && k > 0 && k.is_multiple_of(parts * 8),
            OP,
            || format!("{k} inputs do not split into {parts} parts of a multiple of 8"),
        )?;
        ensure(w.dtype() == DType::BF16, OP, || {
            format!(
                "a product split over k needs a bf16 weight, not {:?}",
                w.dtype()
            )
        })?;
        let t = matmul_rows_in_parts(OP, x, w, shape, parts, out)?;
        if t == 0 || n == 0 {
            return Ok(());
        }
        let xb = self.bf16_operand(x, t * k)?;
        let os = out.f32s_mut(OP)?;
        let (op, _g) = os.device_ptr_mut(&self.stream);
        // SAFETY: `out` holds t * parts * n f32 values (checked above).
        unsafe { self.gemm_bf16_to(&xb, w, (t, k, n), parts, op, GemmOut::F32) }
    }

    /// The bf16 GEMM into the device address `op` of `kind`: cuBLASLt with the plan of
    /// t's bucket of row counts (`gemm_plans.rs`), or `cublasGemmEx` where there is none.
    /// With `parts` > 1, the product over each of `parts` k slices, `[t, parts, n]`.
    ///
    /// # Safety
    /// `op` must address t * parts * n writable elements of `kind` that outlive the GEMM's
    /// run.
    unsafe fn gemm_bf16_to(
        &self,
        xb: &CudaSlice<u16>,
        w: &CudaBuffer,
        (t, k, n): (usize, usize, usize),
        parts: usize,
        op: u64,
        kind: GemmOut,
    ) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let Storage::Bits16(ws) = &w.storage else {
            unreachable!("a BF16 buffer holds 16-bit storage")
        };
        let (wp, _g1) = ws.device_ptr(&self.stream);
        let (xp, _g2) = xb.device_ptr(&self.stream);
        // SAFETY: the caller's contract on `op`; W holds n*k values and xb t*k (checked by
        // the callers).
        unsafe { self.gemm_bf16_at(xp, wp, (t, k, n), (parts, 0), op, kind) }
    }

    /// The bf16 products of two weights of one shape over the same `xb`, as one batched
    /// GEMM into `op`, `[t, 2, n]` of `kind`: the weight at the lower address first, so
    /// the batch stride is positive (cuBLASLt documents no negative one). Returns whether
    /// that is `first` (else `second` came first).
    ///
    /// # Safety
    /// `op` must address t * 2 * n writable elements of `kind` that outlive the GEMM's run.
    pub(super) unsafe fn gemm_pair_bf16_to(
        &self,
        xb: &CudaSlice<u16>,
        [first, second]: [&CudaBuffer; 2],
        (t, k, n): (usize, usize, usize),
        op: u64,
        kind: GemmOut,
    ) -> Result<bool> {
        use cudarc::driver::DevicePtr;
        let (Storage::Bits16(a), Storage::Bits16(b)) = (&first.storage, &second.storage) else {
            unreachable!("BF16 buffers hold 16-bit storage")
        };
        let (ap, _g1) = a.device_ptr(&self.stream);
        let (bp, _g2) = b.device_ptr(&self.stream);
        let (xp, _g3) = xb.device_ptr(&self.stream);
        let first_low = ap < bp;
        let (low, high) = if first_low { (ap, bp) } else { (bp, ap) };
        // Both are allocations of bf16 values, so their distance is whole elements.
        let stride = i64::try_from((high - low) / 2)
            .map_err(|_| super::fused::too_big("matmul", (high - low) as usize))?;
        ensure(stride > 0, "matmul", || "a pair of one weight".to_string())?;
        // SAFETY: the caller's contract on `op`; both weights hold n*k values, xb t*k.
        unsafe { self.gemm_bf16_at(xp, low, (t, k, n), (2, stride), op, kind)? };
        Ok(first_low)
    }

    /// [`Self::gemm_bf16_to`] on device addresses; `(parts, pair_stride)` as in
    /// `GemmOperands` (a pair: two weights `pair_stride` elements apart, over all of k).
    ///
    /// # Safety
    /// As [`Self::gemm_bf16_to`], for the weights at `wp` (and `wp + pair_stride`) and the
    /// operand at `xp`.
    unsafe fn gemm_bf16_at(
        &self,
        xp: u64,
        wp: u64,
        (t, k, n): (usize, usize, usize),
        (parts, pair_stride): (usize, i64),
        op: u64,
        kind: GemmOut,
    ) -> Result<()> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        const OP: &str = "matmul";
        let pair = pair_stride != 0;
        let out_type = match kind {
            GemmOut::F32 => cudaDataType::CUDA_R_32F,
            GemmOut::Bf16 => cudaDataType::CUDA_R_16BF,
        };
        let (m_i, n_i, k_i) = (as_c_int(OP, n)?, as_c_int(OP, t)?, as_c_int(OP, k)?);
        let kp = if pair { k } else { k / parts };
        let (kp_i, ldc_i) = (as_c_int(OP, kp)?, as_c_int(OP, n * parts)?);
        let out_bytes = match kind {
            GemmOut::F32 => 4,
            GemmOut::Bf16 => 2,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.ctx
            .bind_to_thread()
            .map_err(device_err("binding the GPU context"))?;
        if let Some(plans) = &self.gemm_plans {
            let mut plans = plans
                .lock()
                .map_err(|_| KernelError::Device("the GEMM plans' lock is poisoned".into()))?;
            let g = super::gemm_plans::GemmOperands {
                w: wp,
                xb: xp,
                out: op,
                t,
                k,
                n,
                bf16_out: matches!(kind, GemmOut::Bf16),
                parts,
                pair_stride,
            };
            super::host_gaps::mark("cublasLt");
            // SAFETY: the caller's contract on `op`; the weight and the operand hold n*k
            // and t*k values.
            if unsafe { plans.run(&self.stream, g) }? {
                super::host_gaps::mark("cublasLt-returned");
                return Ok(());
            }
        }
        let blas = self
            .blas
            .lock()
            .map_err(|_| KernelError::Device("the cuBLAS handle's lock is poisoned".into()))?;
        super::host_gaps::mark("cublasGemmEx");
        // One call a k slice (one for the whole product when `parts` is 1): slice p starts
        // p * k / parts inputs into every row of W and x, and its outputs p * n values
        // into each output row of `parts * n`. A pair: weight p at p * pair_stride, all of
        // x.
        for p in 0..parts as u64 {
            let (w_at, x_at) = if pair {
                (wp + 2 * p * pair_stride as u64, xp)
            } else {
                (wp + 2 * p * kp as u64, xp + 2 * p * kp as u64)
            };
            // SAFETY: as in SGEMM above: A = W (k x n col-major, transposed), B = x (k x
            // t), C = out (n x t, the caller's contract); each slice stays within them
            // (lda = ldb = k); alpha/beta are f32 as the compute type asks.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    m_i,
                    n_i,
                    kp_i,
                    (&alpha as *const f32).cast(),
                    w_at as *const std::ffi::c_void,
                    cudaDataType::CUDA_R_16BF,
                    k_i,
                    x_at as *const std::ffi::c_void,
                    cudaDataType::CUDA_R_16BF,
                    k_i,
                    (&beta as *const f32).cast(),
                    (op + out_bytes * p * n as u64) as *mut std::ffi::c_void,
                    out_type,
                    ldc_i,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| KernelError::Device(format!("{OP}: cublasGemmEx (bf16): {e:?}")))?;
        }
        super::host_gaps::mark("cublasGemmEx-returned");
        Ok(())
    }

    /// [`crate::Backend::matmul_shared_input`]: bf16 weights take one GEMV launch (few rows)
    /// or one narrowing of x for all their GEMMs (bf16 mode); anything else runs each.
    pub(super) fn matmul_shared_impl(
        &self,
        x: &CudaBuffer,
        mats: &mut [MatmulOut<'_, CudaBuffer>],
    ) -> Result<()> {
        const OP: &str = "matmul_shared_input";
        let Some(first) = mats.first() else {
            return Ok(());
        };
        let k = first.shape.in_features;
        let mut t = 0;
        for m in mats.iter() {
            ensure(m.shape.in_features == k, OP, || {
                format!("in_features {} and {k} differ", m.shape.in_features)
            })?;
            t = matmul_rows(OP, x, m.w, m.shape, m.out)?;
        }
        let xs = x.f32s(OP)?;
        let all_bf16 = mats.iter().all(|m| m.w.dtype() == DType::BF16);
        // The shapes differ in n alone, which no shared path reads.
        let n = first.shape.out_features;
        let path = self.matmul_path(Form::Shared(mats.len()), all_bf16, (t, k, n));
        if path == MatmulPath::Gemv {
            let mut list = Vec::with_capacity(mats.len());
            for m in mats.iter_mut() {
                list.push(super::fused::GemvMat {
                    w: super::fused::buffer_ptr(self, m.w),
                    n: m.shape.out_features,
                    y: super::fused::f32_ptr_mut(self, m.out, OP)?,
                });
            }
            return self.gemv_launch(xs, t, k, &list, super::fused::GemvOut::Plain);
        }
        if path == MatmulPath::Skinny {
            let xb = self.bf16_operand(x, t * k)?;
            let mut list = Vec::with_capacity(mats.len());
            for m in mats.iter_mut() {
                list.push(SkinnyMat {
                    w: super::fused::buffer_ptr(self, m.w),
                    n: m.shape.out_features,
                    y: super::fused::f32_ptr_mut(self, m.out, OP)?,
                    yb: 0,
                });
            }
            return self.skinny_launch(&xb, t, k, &list, super::fused::GemvOut::Plain);
        }
        if path == MatmulPath::GemmBf16 {
            let xb = self.bf16_operand(x, t * k)?;
            return mats
                .iter_mut()
                .filter(|m| m.shape.out_features > 0)
                .try_for_each(|m| self.gemm_bf16(&xb, m.w, t, k, m.shape.out_features, m.out));
        }
        mats.iter_mut()
            .try_for_each(|m| self.matmul_impl(x, m.w, m.shape, m.out))
    }

    /// [`crate::Backend::gated_matmul`]: bf16 weights take the gated GEMV (few rows) or, in
    /// the bf16 mode, two GEMMs on one bf16 operand writing bf16 for `act_mul_bf16_in`;
    /// otherwise two matmuls and `act_mul`.
    pub(super) fn gated_matmul_impl(
        &self,
        act: Activation,
        x: &CudaBuffer,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        shape: MatmulShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "gated_matmul";
        let t = matmul_rows(OP, x, gate, shape, out)?;
        matmul_rows(OP, x, up, shape, out)?;
        let (k, n) = (shape.in_features, shape.out_features);
        if t == 0 || n == 0 {
            return Ok(());
        }
        let xs = x.f32s(OP)?;
        let bf16 = gate.dtype() == DType::BF16 && up.dtype() == DType::BF16;
        let path = self.matmul_path(Form::Gated, bf16, (t, k, n));
        if path == MatmulPath::Gemv {
            let y = super::fused::f32_ptr_mut(self, out, OP)?;
            let mats = [gate, up].map(|w| super::fused::GemvMat {
                w: super::fused::buffer_ptr(self, w),
                n,
                y,
            });
            return self.gemv_launch(xs, t, k, &mats, super::fused::GemvOut::Gated(act));
        }
        // The MLP's down projection reads `out` next.
        let twin = self.gemm_reads_bf16(t);
        if path == MatmulPath::GatedPair {
            return self.gated_pair(act, x, [gate, up], (t, k, n), out, twin);
        }
        if path == MatmulPath::Skinny {
            let xb = self.bf16_operand(x, t * k)?;
            let (y, yb) = super::fused::f32_and_twin_ptrs_mut(self, out, twin, OP)?;
            let mats = [gate, up].map(|w| SkinnyMat {
                w: super::fused::buffer_ptr(self, w),
                n,
                y,
                yb,
            });
            return self.skinny_launch(&xb, t, k, &mats, super::fused::GemvOut::Gated(act));
        }
        if path == MatmulPath::GemmBf16 {
            // Both products in bf16: the activation pass reads half the bytes.
            let xb = self.bf16_operand(x, t * k)?;
            let err = device_err("allocating gated matmul scratch");
            // SAFETY: each GEMM writes all t*n values before act_mul reads them.
            let mut g = unsafe { self.stream.alloc::<u16>(t * n) }.map_err(&err)?;
            // SAFETY: as for `g`.
            let mut u = unsafe { self.stream.alloc::<u16>(t * n) }.map_err(&err)?;
            self.gemm_bf16_out_bf16(&xb, gate, t, k, n, &mut g)?;
            self.gemm_bf16_out_bf16(&xb, up, t, k, n, &mut u)?;
            return self.act_mul_bf16_in(act, &g, &u, out, twin);
        }
        let dt = self.activation_dtype();
        let mut g = self.scratch(out.len(), dt)?;
        let mut u = self.scratch(out.len(), dt)?;
        self.matmul_impl(x, gate, shape, &mut g)?;
        self.matmul_impl(x, up, shape, &mut u)?;
        self.act_mul_impl(act, &g, &u, out, twin)
    }
}
