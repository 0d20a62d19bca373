//! Attention for sequences with many query rows (prefill chunks) through cuBLAS.
//!
//! The paged kernel walks keys one at a time per (query row, head) on CUDA cores, which is
//! right for decode and slow for a 4096-token prefill (`docs/perf-notes.md`). Here a
//! sequence's visible keys and values are gathered once into dense f32 arrays, and each tile
//! of query rows becomes two batched GEMMs per KV head (S = Q K^T over the group's heads,
//! then O = P V written straight into the output rows) around a masked-softmax kernel. The
//! GEMMs run in f32 (exact path) or TF32 on tensor cores (the backend's bf16 speed mode).

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::paged::CudaKvSlab;
use super::{device_err, CudaBackend};
use crate::{AttentionParams, KernelError, PagedSeq, Result};

/// Bytes the score matrix of one query tile may take.
const SCORE_BUDGET: usize = 512 << 20;

fn c_int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Invalid {
        op: "dense attention",
        detail: format!("dimension {v} exceeds cuBLAS's 32-bit sizes"),
    })
}

/// One strided-batched f32 GEMM (column-major, as cuBLAS sees it); pointers are raw
/// device addresses so callers can offset into buffers.
struct Gemm {
    transa: cublasOperation_t,
    m: usize,
    n: usize,
    k: usize,
    a: u64,
    lda: usize,
    stride_a: usize,
    b: u64,
    ldb: usize,
    stride_b: usize,
    c: u64,
    ldc: usize,
    stride_c: usize,
    batch: usize,
}

impl CudaBackend {
    fn gemm_f32_batched(&self, g: &Gemm) -> Result<()> {
        let compute = if self.bf16_gemm {
            cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self
            .blas
            .lock()
            .map_err(|_| KernelError::Device("the cuBLAS handle's lock is poisoned".into()))?;
        super::host_gaps::mark("cublasGemmStridedBatchedEx");
        // SAFETY: the caller derives every pointer, leading dimension and stride from
        // buffers whose sizes it checked; f32 data, f32 scalars for a 32F compute type.
        let ran = unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                g.transa,
                cublasOperation_t::CUBLAS_OP_N,
                c_int(g.m)?,
                c_int(g.n)?,
                c_int(g.k)?,
                (&alpha as *const f32).cast(),
                g.a as *const std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                c_int(g.lda)?,
                g.stride_a as i64,
                g.b as *const std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                c_int(g.ldb)?,
                g.stride_b as i64,
                (&beta as *const f32).cast(),
                g.c as *mut std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                c_int(g.ldc)?,
                g.stride_c as i64,
                c_int(g.batch)?,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        super::host_gaps::mark("cublasGemmStridedBatchedEx-returned");
        ran.map_err(|e| KernelError::Device(format!("dense attention: cuBLAS: {e:?}")))
    }

    /// Attends `seq`'s query rows of `q` into `out` (both `[rows, n_heads, d]` f32) over
    /// the keys its slots (`slots[seq.slot_offset ..]`) name in `slab`.
    pub(super) fn dense_attention(
        &self,
        q: &CudaSlice<f32>,
        slab: &CudaKvSlab,
        slots: &CudaSlice<u32>,
        seq: &PagedSeq,
        p: AttentionParams,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (d, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
        let group = nh / nkv;
        let n_keys = seq.k_len();
        if seq.q_len == 0 || n_keys == 0 {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(device_err("binding the GPU context"))?;
        let err = device_err("allocating dense attention buffers");
        // SAFETY: every element is written by kv_gather before the GEMMs read it.
        let (mut kd, mut vd) = unsafe {
            (
                self.stream.alloc::<f32>(n_keys * nkv * d).map_err(&err)?,
                self.stream.alloc::<f32>(n_keys * nkv * d).map_err(&err)?,
            )
        };
        let (nkv_i, d_i, fmt) = (
            c_int(nkv)?,
            c_int(d)?,
            super::paged::format_code(slab.shape.format),
        );
        let seq_slots = slots.slice(seq.slot_offset..seq.slot_offset + n_keys);
        let mut l = self.stream.launch_builder(self.kernels.get("kv_gather")?);
        slab.push_args(&mut l);
        l.arg(&seq_slots)
            .arg(&mut kd)
            .arg(&mut vd)
            .arg(&nkv_i)
            .arg(&d_i)
            .arg(&fmt);
        let cfg = LaunchConfig {
            grid_dim: (n_keys as u32, nkv as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: n_keys slots, each a row of the slab (the pool's invariant, checked on the
        // batch through its slot limit); kd / vd hold n_keys x nkv x d.
        unsafe { l.launch(cfg) }.map_err(device_err("kv_gather"))?;

        // Query tiles: a window's worth for sliding layers (keys then span under two
        // windows), else as many rows as the score budget allows.
        let tile = match p.window {
            Some(w) => w.clamp(16, 1024),
            None => (SCORE_BUDGET / (4 * group * n_keys)).clamp(16, 4096),
        }
        .min(seq.q_len);
        let window = p.window.map_or(-1i64, |w| w as i64);
        let has_cap = i32::from(p.softcap.is_some());
        let cap = p.softcap.unwrap_or(1.0);
        let f32b = 4usize;
        let (qp, _gq) = q.device_ptr(&self.stream);
        let (kp, _gk) = kd.device_ptr(&self.stream);
        let (vp, _gv) = vd.device_ptr(&self.stream);
        let max_keys_tile = match p.window {
            Some(w) => (tile + w - 1).min(n_keys),
            None => n_keys,
        };
        // SAFETY: written by the score GEMM before masked_softmax reads it.
        let mut scores =
            unsafe { self.stream.alloc::<f32>(group * tile * max_keys_tile) }.map_err(&err)?;
        let mut r0 = 0;
        while r0 < seq.q_len {
            let rows = tile.min(seq.q_len - r0);
            let q_pos0 = seq.q_start + r0;
            let last = q_pos0 + rows - 1;
            // Visible key indices (from k_start) for this tile: lo..=hi.
            let lo = match p.window {
                Some(w) => (q_pos0 + 1).saturating_sub(w).saturating_sub(seq.k_start),
                None => 0,
            };
            let hi = last - seq.k_start;
            let nk = hi + 1 - lo;
            for kvh in 0..nkv {
                let h0 = kvh * group;
                let q_row = (seq.q_offset + r0) * nh + h0;
                let (sp, _gs) = scores.device_ptr_mut(&self.stream);
                // S[h][i][j] = Q[i, h] . K[lo + j]: C (nk x rows, col-major) = K^T Q.
                self.gemm_f32_batched(&Gemm {
                    transa: cublasOperation_t::CUBLAS_OP_T,
                    m: nk,
                    n: rows,
                    k: d,
                    a: kp + ((lo * nkv + kvh) * d * f32b) as u64,
                    lda: nkv * d,
                    stride_a: 0,
                    b: qp + (q_row * d * f32b) as u64,
                    ldb: nh * d,
                    stride_b: d,
                    c: sp,
                    ldc: nk,
                    stride_c: rows * nk,
                    batch: group,
                })?;
                drop(_gs);
                let (nk_i, rows_i) = (c_int(nk)?, c_int(rows)?);
                let (qp0, kp0) = (q_pos0 as i64, (seq.k_start + lo) as i64);
                let mut l = self
                    .stream
                    .launch_builder(self.kernels.get("masked_softmax")?);
                l.arg(&mut scores)
                    .arg(&nk_i)
                    .arg(&rows_i)
                    .arg(&qp0)
                    .arg(&kp0)
                    .arg(&p.scale)
                    .arg(&has_cap)
                    .arg(&cap)
                    .arg(&window);
                let cfg = LaunchConfig {
                    grid_dim: ((group * rows) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: scores hold group x rows x nk values, written by the GEMM above.
                unsafe { l.launch(cfg) }.map_err(device_err("masked_softmax"))?;
                let (sp, _gs) = scores.device_ptr(&self.stream);
                let (op, _go) = out.device_ptr_mut(&self.stream);
                // O[i, h] = sum_j P[h][i][j] V[lo + j]: C (d x rows, col-major) = V^T P.
                self.gemm_f32_batched(&Gemm {
                    transa: cublasOperation_t::CUBLAS_OP_N,
                    m: d,
                    n: rows,
                    k: nk,
                    a: vp + ((lo * nkv + kvh) * d * f32b) as u64,
                    lda: nkv * d,
                    stride_a: 0,
                    b: sp,
                    ldb: nk,
                    stride_b: rows * nk,
                    c: op + (q_row * d * f32b) as u64,
                    ldc: nh * d,
                    stride_c: d,
                    batch: group,
                })?;
            }
            r0 += rows;
        }
        Ok(())
    }
}
