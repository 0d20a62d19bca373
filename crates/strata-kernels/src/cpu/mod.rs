//! The CPU backend: f32 activations, rayon parallelism, the numerical reference for every op.

mod attention;
mod buffer;
mod conformer;
mod copy;
mod dot;
mod elementwise;
mod embedding;
mod kv_row;
pub(crate) mod lora;
mod matmul;
mod norm;
mod paged;
mod par;
mod rope;

/// What [`RowDot::prepare`] fills (reachable here because `quant` is private to the crate).
pub use crate::quant::PreparedInput;
pub use attention::{attention_over, ContiguousKv, KvSource};
pub use buffer::CpuBuffer;
pub use conformer::{chunked_attention_rows, depthwise_conv1d_causal_rows};
pub use elementwise::{gelu_tanh, sigmoid, silu};
pub use kv_row::KvRow;
pub use paged::{CpuKvSlab, CpuPagedBatch};

use crate::backend::DeviceBuffer;
use crate::quant::RowDot;
use crate::sampling::{Picked, RowDraw};
use crate::Result;
use crate::{
    Activation, AttentionParams, Backend, ChunkedAttentionParams, ClusterPick, DType,
    DepthwiseConv, HostSlice, KernelError, LoraShape, LoraStacks, MatmulShape, ResidualStep,
    RmsNormParams, RopeParams, StridedCopy,
};
use std::sync::Arc;

/// Runs every op on the host with rayon: on the global pool by default, or on a private
/// pool of a fixed size ([`CpuBackend::with_threads`]) so an engine can keep cores for
/// other work and tests can pin the thread count.
#[derive(Clone, Default)]
pub struct CpuBackend {
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("threads", &self.threads())
            .finish()
    }
}

impl CpuBackend {
    /// Uses rayon's global pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses a private pool of `threads` workers.
    pub fn with_threads(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("strata-cpu-{i}"))
            .build()
            .map_err(|e| KernelError::Device(e.to_string()))?;
        Ok(Self {
            pool: Some(Arc::new(pool)),
        })
    }

    /// Worker threads ops run on: the private pool's size, else the global pool's.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    /// Runs `work`, a loop of many ops such as an engine's steps, on one of the threads the
    /// ops run on (the private pool's, else rayon's global pool's), and waits for it. Each
    /// op's parallel loop then starts on that thread, which takes its share, instead of being
    /// handed over from another thread and waited for: a small model's decode step runs
    /// hundreds of ops, and each hand-over (a wake-up and a sleep) costs about as much as
    /// the op.
    pub fn run_on_workers<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(work),
            None => rayon::scope(|_| work()),
        }
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Attention whose keys and values are read through `kv` (e.g. straight from a paged,
    /// quantized KV pool) instead of contiguous buffers; same maths as [`Backend::attention`].
    pub fn attention_paged<K: KvSource>(
        &self,
        q: &CpuBuffer,
        q_positions: &[u32],
        kv: &K,
        p: AttentionParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        let q = q.f32s("attention")?;
        let out = out.f32s_mut("attention")?;
        self.install(|| attention_over(q, q_positions, kv, p, out))
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type QuantMatrix = dyn RowDot;
    type KvSlab = CpuKvSlab;
    type Index = Vec<u32>;
    type PagedBatch = CpuPagedBatch;
    type Graph = ();
    type Tokens = Vec<Picked>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn activation_dtype(&self) -> DType {
        DType::F32
    }

    fn upload(&self, data: HostSlice<'_>) -> Result<CpuBuffer> {
        Ok(match data {
            HostSlice::F32(s) => CpuBuffer::F32(s.to_vec()),
            HostSlice::BF16(s) => CpuBuffer::BF16(s.to_vec()),
            HostSlice::F16(s) => CpuBuffer::F16(s.to_vec()),
        })
    }

    fn zeros(&self, len: usize, dtype: DType) -> Result<CpuBuffer> {
        Ok(match dtype {
            DType::F32 => CpuBuffer::F32(vec![0.0; len]),
            DType::BF16 => CpuBuffer::BF16(vec![half::bf16::ZERO; len]),
            DType::F16 => CpuBuffer::F16(vec![half::f16::ZERO; len]),
        })
    }

    fn download(&self, buf: &CpuBuffer) -> Result<Vec<f32>> {
        Ok(buf.to_f32_vec())
    }

    fn copy_strided(&self, src: &CpuBuffer, dst: &mut CpuBuffer, c: StridedCopy) -> Result<()> {
        copy::copy_strided(src, dst, c)
    }

    fn embedding(
        &self,
        ids: &[u32],
        table: &CpuBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| embedding::embedding(ids, table, hidden, scale, out))
    }

    fn embedding_quant(
        &self,
        ids: &[u32],
        table: &dyn RowDot,
        scale: f32,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| embedding::embedding_quant(ids, table, scale, out))
    }

    fn rms_norm(
        &self,
        x: &CpuBuffer,
        weight: Option<&CpuBuffer>,
        p: RmsNormParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| norm::rms_norm(x, weight, p, out))
    }

    fn residual_norm(
        &self,
        residual: &mut CpuBuffer,
        x: &CpuBuffer,
        p: RmsNormParams,
        step: ResidualStep<'_, CpuBuffer>,
    ) -> Result<()> {
        match step {
            ResidualStep::AddThenNorm { weight, out } => {
                self.install(|| norm::add_rms_norm(residual, x, weight, p, out))
            }
            // The post-norm chain op by op: the CPU has no fused pass to gain from.
            ResidualStep::NormThenAdd {
                weight,
                scale,
                next,
            } => {
                self.install(|| norm::rms_norm_add(residual, x, weight, p))?;
                if scale != 1.0 {
                    self.scale(residual, scale)?;
                }
                match next {
                    Some(n) => self.rms_norm(residual, n.weight, p.whole(), n.out),
                    None => Ok(()),
                }
            }
        }
    }

    fn rope(
        &self,
        x: &mut CpuBuffer,
        positions: &[u32],
        inv_freq: &CpuBuffer,
        p: RopeParams,
    ) -> Result<()> {
        self.install(|| rope::rope(x, positions, inv_freq, p))
    }

    fn matmul(
        &self,
        x: &CpuBuffer,
        w: &CpuBuffer,
        shape: MatmulShape,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| matmul::matmul(x, w, shape, out))
    }

    fn matmul_parts(
        &self,
        x: &CpuBuffer,
        w: &CpuBuffer,
        shape: MatmulShape,
        parts: usize,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| matmul::matmul_parts(x, w, shape, parts, out))
    }

    fn matmul_quant(&self, x: &CpuBuffer, w: &dyn RowDot, out: &mut CpuBuffer) -> Result<()> {
        self.install(|| matmul::matmul_quant(x, w, out))
    }

    fn matmul_quant_shared_input(
        &self,
        x: &CpuBuffer,
        mats: &mut [(&Self::QuantMatrix, &mut CpuBuffer)],
    ) -> Result<()> {
        self.install(|| matmul::matmul_quant_shared(x, mats))
    }

    fn gated_matmul_quant(
        &self,
        act: Activation,
        x: &CpuBuffer,
        gate: &dyn RowDot,
        up: &dyn RowDot,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| matmul::gated_matmul_quant(act, x, gate, up, out))
    }

    fn lora_bgmv(
        &self,
        x: &CpuBuffer,
        stacks: LoraStacks<'_, CpuBuffer>,
        slots: &Vec<u32>,
        shape: LoraShape,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| lora::lora_bgmv(x, stacks, slots, shape, out))
    }

    fn act_mul(
        &self,
        act: Activation,
        gate: &CpuBuffer,
        up: &CpuBuffer,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| elementwise::act_mul(act, gate, up, out))
    }

    fn activation(&self, act: Activation, x: &CpuBuffer, out: &mut CpuBuffer) -> Result<()> {
        self.install(|| elementwise::activation(act, x, out))
    }

    fn softcap(&self, x: &mut CpuBuffer, cap: f32) -> Result<()> {
        self.install(|| elementwise::softcap(x, cap))
    }

    fn clamp(&self, x: &mut CpuBuffer, lo: f32, hi: f32) -> Result<()> {
        self.install(|| conformer::clamp(x, lo, hi))
    }

    fn depthwise_conv1d_causal(
        &self,
        x: &CpuBuffer,
        w: &CpuBuffer,
        p: DepthwiseConv,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| conformer::depthwise_conv1d_causal(x, w, p, out))
    }

    fn chunked_attention(
        &self,
        q: &CpuBuffer,
        k: &CpuBuffer,
        v: &CpuBuffer,
        rel_k: &CpuBuffer,
        p: ChunkedAttentionParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| conformer::chunked_attention(q, k, v, rel_k, p, out))
    }

    fn add(&self, acc: &mut CpuBuffer, x: &CpuBuffer) -> Result<()> {
        self.install(|| elementwise::add(acc, x))
    }

    fn mul(&self, acc: &mut CpuBuffer, x: &CpuBuffer) -> Result<()> {
        self.install(|| elementwise::mul(acc, x))
    }

    fn scale(&self, x: &mut CpuBuffer, s: f32) -> Result<()> {
        self.install(|| elementwise::scale(x, s))
    }

    fn attention(
        &self,
        q: &CpuBuffer,
        k: &CpuBuffer,
        v: &CpuBuffer,
        q_positions: &[u32],
        k_positions: &[u32],
        p: AttentionParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| attention::attention(q, k, v, q_positions, k_positions, p, out))
    }

    fn kv_slab(&self, shape: crate::KvSlabShape) -> Result<CpuKvSlab> {
        Ok(paged::new_slab(shape))
    }

    fn kv_slab_contents(&self, slab: &CpuKvSlab) -> Result<crate::KvSlabContents> {
        Ok(slab.data.clone())
    }

    fn upload_index(&self, index: &[u32]) -> Result<Vec<u32>> {
        Ok(index.to_vec())
    }

    fn kv_store(
        &self,
        slab: &mut CpuKvSlab,
        k: &CpuBuffer,
        v: &CpuBuffer,
        slots: &Vec<u32>,
    ) -> Result<()> {
        paged::store(slab, k, v, slots)
    }

    fn paged_batch(&self, seqs: &[crate::PagedSeq], slots: &[u32]) -> Result<CpuPagedBatch> {
        paged::batch(seqs, slots)
    }

    fn paged_attention(
        &self,
        q: &CpuBuffer,
        slab: &CpuKvSlab,
        batch: &CpuPagedBatch,
        p: AttentionParams,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.install(|| paged::attention(q, slab, batch, p, out))
    }

    fn pick_start(
        &self,
        logits: &CpuBuffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<Vec<Picked>> {
        // Raw f32 logits are read where they lie: the host copy the default makes is a
        // vocabulary's worth of bytes a step.
        match (logits, softcap) {
            (CpuBuffer::F32(v), None) if vocab > 0 && v.len() >= rows * vocab => Ok(
                crate::sampling::pick_rows(&v[..rows * vocab], vocab, rows, draws)?,
            ),
            _ => self.pick_on_host(logits, vocab, rows, softcap, draws),
        }
    }

    fn pick_finish(&self, tokens: Vec<Picked>) -> Result<Vec<Picked>> {
        Ok(tokens)
    }

    fn feed_tokens(&self, ids: &mut Vec<u32>, tokens: &Vec<Picked>) -> Result<()> {
        crate::sampling::feed_tokens(ids, &crate::sampling::pick_ids(tokens));
        Ok(())
    }

    fn adjust_logits(
        &self,
        logits: &mut CpuBuffer,
        vocab: usize,
        rows: &[crate::sampling::RowAdjust],
        fed: Option<&Vec<Picked>>,
    ) -> Result<()> {
        let logits = logits.f32s_mut("adjust_logits")?;
        let fed = fed
            .map(|t| crate::sampling::pick_ids(t))
            .unwrap_or_default();
        Ok(crate::sampling::adjust_rows(logits, vocab, rows, &fed)?)
    }

    fn mask_logits(
        &self,
        logits: &mut CpuBuffer,
        vocab: usize,
        rows: &[crate::sampling::RowMask],
    ) -> Result<()> {
        let logits = logits.f32s_mut("mask_logits")?;
        Ok(crate::sampling::mask_rows(logits, vocab, rows)?)
    }

    fn clustered_argmax(
        &self,
        logits: &CpuBuffer,
        scores: &CpuBuffer,
        ordering: &Vec<u32>,
        c: ClusterPick,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        crate::error::ensure(
            c.clusters > 0
                && c.vocab == ordering.len()
                && c.vocab.is_multiple_of(c.clusters)
                && logits.len() >= c.rows * c.vocab
                && scores.len() >= c.rows * c.clusters
                && out.len() >= c.rows,
            "clustered_argmax",
            || {
                format!(
                    "{c:?} over {} logits, {} scores, an ordering of {} and {} outputs",
                    logits.len(),
                    scores.len(),
                    ordering.len(),
                    out.len()
                )
            },
        )?;
        let (l, s) = (self.download(logits)?, self.download(scores)?);
        for r in 0..c.rows {
            out[r] = crate::sampling::clustered_argmax(
                &l[r * c.vocab..(r + 1) * c.vocab],
                &s[r * c.clusters..(r + 1) * c.clusters],
                ordering,
                c.top_k,
            );
        }
        Ok(())
    }

    fn download_index(&self, index: &Vec<u32>) -> Result<Vec<u32>> {
        Ok(index.clone())
    }

    fn write_index(&self, index: &mut Vec<u32>, data: &[u32]) -> Result<()> {
        crate::error::ensure(index.len() == data.len(), "write_index", || {
            format!("{} values for an index of {}", data.len(), index.len())
        })?;
        index.copy_from_slice(data);
        Ok(())
    }

    fn paged_batch_with_capacity(
        &self,
        seqs: &[crate::PagedSeq],
        slots: &[u32],
        _slot_capacity: usize,
    ) -> Result<CpuPagedBatch> {
        paged::batch(seqs, slots)
    }

    fn paged_batch_update(
        &self,
        batch: &mut CpuPagedBatch,
        seqs: &[crate::PagedSeq],
        slots: &[u32],
    ) -> Result<()> {
        *batch = paged::batch(seqs, slots)?;
        Ok(())
    }

    fn embedding_idx(
        &self,
        ids: &Vec<u32>,
        table: &CpuBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.embedding(ids, table, hidden, scale, out)
    }

    fn embedding_quant_idx(
        &self,
        ids: &Vec<u32>,
        table: &(dyn RowDot + 'static),
        scale: f32,
        out: &mut CpuBuffer,
    ) -> Result<()> {
        self.embedding_quant(ids, table, scale, out)
    }

    fn rope_idx(
        &self,
        x: &mut CpuBuffer,
        positions: &Vec<u32>,
        inv_freq: &CpuBuffer,
        p: RopeParams,
    ) -> Result<()> {
        self.rope(x, positions, inv_freq, p)
    }
}
