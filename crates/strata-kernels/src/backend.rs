//! The op interface every backend implements.

use crate::paged::{KvSlabContents, KvSlabShape, PagedSeq};
use crate::params::{
    Activation, AttentionParams, ChunkedAttentionParams, ClusterPick, DepthwiseConv, LoraOut,
    LoraShape, LoraStacks, MatmulOut, MatmulShape, QkvPrep, ResidualStep, RmsNormParams,
    RopeParams, StridedCopy, TableSlice,
};
use crate::quant::MatrixShape;
use crate::sampling::{self, RowDraw};
use crate::{DType, HostSlice, Result};

/// Where RoPE reads its positions and frequencies: token `t` sits at `positions[t]` (in
/// backend memory); `inv_freq` is an F32 buffer of `head_dim / 2` frequencies.
pub struct RopeAt<'a, B: Backend + ?Sized> {
    /// One position a token.
    pub positions: &'a B::Index,
    /// The rotation frequencies (a zero leaves its pair unchanged).
    pub inv_freq: &'a B::Buffer,
}

impl<B: Backend + ?Sized> Clone for RopeAt<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend + ?Sized> Copy for RopeAt<'_, B> {}

/// A buffer owned by a backend (host memory for the CPU backend, device memory for CUDA).
pub trait DeviceBuffer {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Element type of the stored values.
    fn dtype(&self) -> DType;
    /// Whether [`DeviceBuffer::len`] is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Elements the allocation holds (at least [`DeviceBuffer::len`]).
    fn capacity(&self) -> usize;
    /// Sets the element count within [`DeviceBuffer::capacity`], keeping the allocation and
    /// so its address: one buffer serves captured steps of several sizes. Values past the
    /// old length are unspecified. A shape error past the capacity.
    fn set_len(&mut self, len: usize) -> Result<()>;
}

/// Every model op, once per backend.
///
/// The trait is generic (associated buffer types), not object-safe by design: buffers are
/// backend-specific, so a `dyn` interface would have to downcast every argument of every
/// call, and the model code is written once as `Model<B: Backend>` and monomorphised, which
/// keeps dispatch out of the decode loop. (A `dyn Backend<Buffer = X, QuantMatrix = Y>` is
/// still possible where a caller wants one.)
///
/// Conventions shared by all ops:
/// - Activations are row-major, in the backend's [`Backend::activation_dtype`]; weights
///   (matmul matrices, norm weights, embedding tables) may be F32, BF16 or F16.
/// - Outputs go to caller-allocated buffers (`out`), so a GPU backend can keep fixed
///   addresses (CUDA graphs) and the model controls allocation.
/// - Small integer inputs (token ids, positions) are host slices; a device backend copies
///   them into staging buffers it owns.
/// - Lengths are checked; a mismatch is `Err(KernelError::Shape)`, never a panic.
pub trait Backend: Send + Sync {
    /// An activation or weight buffer of one [`DType`] in this backend's memory.
    type Buffer: DeviceBuffer + Send + Sync;
    /// A quantized weight matrix in whatever form the backend computes with
    /// (CPU: `dyn RowDot`, implemented by the weights crate's tensors).
    type QuantMatrix: MatrixShape + Send + Sync + ?Sized;
    /// One KV-owning layer's K/V rows (and 8-bit scales) in the pool's layout.
    type KvSlab: Send + Sync;
    /// A u32 index array in backend memory (slot lists).
    type Index: Send + Sync;
    /// A paged attention call's sequence descriptions and slot table, uploaded once per
    /// forward step and reused by every layer of the same attention group.
    type PagedBatch: Send + Sync;
    /// A captured sequence of ops that can be replayed (CUDA graphs); `()` where the
    /// backend has none.
    type Graph: Send + Sync;
    /// A step's tokens left where its logits were, their copy to the host under way
    /// ([`Backend::pick_start`]).
    type Tokens: Send + Sync;

    /// Short backend name for logs and test output (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// The dtype activations are kept in (inputs and outputs of every op below).
    fn activation_dtype(&self) -> DType;

    // ---- memory -----------------------------------------------------------------------

    /// Copies host data into a new buffer of the same dtype.
    fn upload(&self, data: HostSlice<'_>) -> Result<Self::Buffer>;

    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize, dtype: DType) -> Result<Self::Buffer>;

    /// A buffer of `len` values whose contents are unspecified: for outputs the caller
    /// writes in full before reading (a device backend skips the zero fill).
    fn scratch(&self, len: usize, dtype: DType) -> Result<Self::Buffer> {
        self.zeros(len, dtype)
    }

    /// The buffer's values widened to f32 (waits for pending work).
    fn download(&self, buf: &Self::Buffer) -> Result<Vec<f32>>;

    /// Copies f32 host data into a new buffer of `dtype`, rounding to nearest-even.
    fn upload_f32_as(&self, data: &[f32], dtype: DType) -> Result<Self::Buffer> {
        match dtype {
            DType::F32 => self.upload(HostSlice::F32(data)),
            DType::BF16 => {
                let v: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
                self.upload(HostSlice::BF16(&v))
            }
            DType::F16 => {
                let v: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
                self.upload(HostSlice::F16(&v))
            }
        }
    }

    /// Strided 2-D copy between two buffers of the same dtype.
    fn copy_strided(
        &self,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        c: StridedCopy,
    ) -> Result<()>;

    // ---- embedding ----------------------------------------------------------------------

    /// `out[t, :] = table[ids[t], :] * scale`; `table` is `[vocab, hidden]` of any weight dtype.
    /// The scale is applied in f32 after widening the row, so pass it already rounded
    /// the way the reference does (Gemma: `sqrt(H)` rounded to the weight dtype).
    fn embedding(
        &self,
        ids: &[u32],
        table: &Self::Buffer,
        hidden: usize,
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// As [`Backend::embedding`] with a quantized table (`rows` = vocab, `cols` = hidden).
    fn embedding_quant(
        &self,
        ids: &[u32],
        table: &Self::QuantMatrix,
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    // ---- norms --------------------------------------------------------------------------

    /// RMSNorm over every row of `p.dim` elements of `x` (per-head q/k/v norms: `dim = head_dim`).
    /// `weight` is `[dim]` or `None` for the scale-free norm.
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        weight: Option<&Self::Buffer>,
        p: RmsNormParams,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// One residual step around an RMSNorm over rows of `p.dim` (`p.parts` applies to `x`
    /// only); [`ResidualStep`] says which: the pre-norm add, or Gemma's sandwich norm with
    /// its layer scalar and the next pre-norm folded in.
    fn residual_norm(
        &self,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        p: RmsNormParams,
        step: ResidualStep<'_, Self::Buffer>,
    ) -> Result<()>;

    // ---- RoPE ---------------------------------------------------------------------------

    /// Rotates `x [T, n_heads, head_dim]` in place; token `t` sits at `positions[t]`.
    /// `inv_freq` is an F32 buffer of `head_dim / 2` frequencies; a zero frequency leaves its
    /// pair unchanged (proportional / partial RoPE).
    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        inv_freq: &Self::Buffer,
        p: RopeParams,
    ) -> Result<()>;

    // ---- matmul -------------------------------------------------------------------------

    /// `out [T, out_features] = x [T, in_features] * W^T`, `W` dense `[out_features, in_features]`.
    fn matmul(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        shape: MatmulShape,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Into how many parts [`Backend::matmul_parts`] should split the product of the
    /// dense `w` (`shape`) over `rows` rows, for a result that only a norm reads (it adds
    /// the parts: [`RmsNormParams::parts`], [`Backend::head_norm_rope_parts_idx`]). 1, the
    /// default, where the split gains nothing.
    fn matmul_k_parts(&self, _w: &Self::Buffer, _shape: MatmulShape, _rows: usize) -> usize {
        1
    }

    /// `out [T, parts, out_features]`: part `p` of row `t` is the product of row `t` of
    /// `x` and `W` over the `p`-th of `parts` equal slices of the inputs
    /// (`in_features` a multiple of `parts`). The parts add up to [`Backend::matmul`]'s
    /// product; a norm that reads them adds them as it loads its row, so the split needs
    /// no reduction pass of its own. `parts = 1` is [`Backend::matmul`].
    fn matmul_parts(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        shape: MatmulShape,
        parts: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// As [`Backend::matmul`] with a quantized `W` (`rows` = out_features, `cols` = in_features).
    fn matmul_quant(
        &self,
        x: &Self::Buffer,
        w: &Self::QuantMatrix,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Adds each row's LoRA product, picked by slot (Punica's batched gather
    /// matrix-vector product): for every row `r < shape.rows` whose `slots[r]` is below
    /// `shape.slots`, `out[r] += scale[s] * B[s] (A[s] x[r])` with `s = slots[r]`, `A[s]`
    /// the `[rank, cols]` matrix at `s * rank * cols` of `stacks.a`, `B[s]` the
    /// `[out, rank]` one at `s * out * rank` of `stacks.b` and `scale[s]` element `s` of
    /// `stacks.scales`. `h = A[s] x[r]` stays in f32 (each `h[k]` a dot product of the row,
    /// then `y[j]` the dot of row `j` of `B[s]` with `h`, and `out[r][j] += scale[s] * y[j]`). Rows of any other slot
    /// (`u32::MAX`: no adapter) are left as they are. `slots` is the index
    /// [`crate::lora_slot_index`] makes: the rows' slots, then the rows sorted by slot, the
    /// order a backend may take them in. Since the slots are data, a captured step replays
    /// with other adapters on its rows. `x` is `[rows, cols]` and `out`
    /// `[rows, out]`, both in the activation dtype; `a` and `b` share a weight dtype.
    fn lora_bgmv(
        &self,
        x: &Self::Buffer,
        stacks: LoraStacks<'_, Self::Buffer>,
        slots: &Self::Index,
        shape: LoraShape,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// [`Backend::lora_bgmv`] for several parts that read the same `x` (a layer's q, k and
    /// v; gate and up), each with its own stacks, adding to its own `out`: `shape` gives the
    /// rows, slots, rank and `cols` they share, each part its `out_features` (`shape.out`
    /// is not read). Each part's result is the one `lora_bgmv` gives it alone. One call so a
    /// backend can run the parts' passes as one launch each.
    fn lora_bgmv_shared_input(
        &self,
        x: &Self::Buffer,
        parts: &mut [LoraOut<'_, Self::Buffer>],
        slots: &Self::Index,
        shape: LoraShape,
    ) -> Result<()> {
        for p in parts.iter_mut() {
            let s = LoraShape {
                out: p.out_features,
                ..shape
            };
            self.lora_bgmv(x, p.stacks, slots, s, p.out)?;
        }
        Ok(())
    }

    /// `m.out = x * m.w^T` for each of `mats`, dense weights that all read the same `x` (a
    /// layer's q, k and v projections; every shape has the same `in_features`). One call so
    /// a backend can prepare `x` once and run the products as one kernel.
    fn matmul_shared_input(
        &self,
        x: &Self::Buffer,
        mats: &mut [MatmulOut<'_, Self::Buffer>],
    ) -> Result<()> {
        for m in mats.iter_mut() {
            self.matmul(x, m.w, m.shape, m.out)?;
        }
        Ok(())
    }

    /// `out_i = x * w_i^T` for each `(w_i, out_i)` of `mats`, quantized matrices that all
    /// read the same `x` (a layer's q, k and v): each result the one
    /// [`Backend::matmul_quant`] gives. One call so a backend can convert `x` once and run
    /// the products as one parallel pass.
    fn matmul_quant_shared_input(
        &self,
        x: &Self::Buffer,
        mats: &mut [(&Self::QuantMatrix, &mut Self::Buffer)],
    ) -> Result<()> {
        for (w, out) in mats.iter_mut() {
            self.matmul_quant(x, w, out)?;
        }
        Ok(())
    }

    /// `out = act(x * gate^T) * (x * up^T)` for quantized `gate` and `up` of one shape,
    /// with the bits of the two [`Backend::matmul_quant`]s and [`Backend::act_mul`]. A
    /// backend may fuse them so that neither product reaches memory.
    fn gated_matmul_quant(
        &self,
        act: Activation,
        x: &Self::Buffer,
        gate: &Self::QuantMatrix,
        up: &Self::QuantMatrix,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let dt = self.activation_dtype();
        let mut g = self.scratch(out.len(), dt)?;
        let mut u = self.scratch(out.len(), dt)?;
        self.matmul_quant(x, gate, &mut g)?;
        self.matmul_quant(x, up, &mut u)?;
        self.act_mul(act, &g, &u, out)
    }

    /// `out = act(x * gate^T) * (x * up^T)`, the first half of a gated MLP, for dense
    /// `gate` and `up` of one `shape`. A backend may fuse the two products and the
    /// activation so that neither product reaches memory.
    fn gated_matmul(
        &self,
        act: Activation,
        x: &Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        shape: MatmulShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let dt = self.activation_dtype();
        let mut g = self.scratch(out.len(), dt)?;
        let mut u = self.scratch(out.len(), dt)?;
        self.matmul(x, gate, shape, &mut g)?;
        self.matmul(x, up, shape, &mut u)?;
        self.act_mul(act, &g, &u, out)
    }

    /// `out[t, i] = act((x * gate^T)[t, i]) * table[t * s.stride + s.offset + i]` for a dense
    /// `gate` of `shape` (`s.cols` = its out_features): Gemma-4's per-layer-input gate over
    /// its slice of the per-layer inputs. A backend may fuse the product into the gated
    /// slice so that the product never reaches memory.
    #[allow(clippy::too_many_arguments)]
    fn gated_slice_matmul(
        &self,
        act: Activation,
        x: &Self::Buffer,
        gate: &Self::Buffer,
        shape: MatmulShape,
        table: &Self::Buffer,
        s: TableSlice,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let mut g = self.scratch(out.len(), self.activation_dtype())?;
        self.matmul(x, gate, shape, &mut g)?;
        self.act_mul_slice(act, &g, table, s, out)
    }

    // ---- elementwise --------------------------------------------------------------------

    /// `out = act(gate) * up` (the gated MLP's middle).
    fn act_mul(
        &self,
        act: Activation,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out = act(x)` (Gemma-4's per-layer-input gate).
    fn activation(&self, act: Activation, x: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `x = cap * tanh(x / cap)` in place (final logit softcap).
    fn softcap(&self, x: &mut Self::Buffer, cap: f32) -> Result<()>;

    /// `x = x.clamp(lo, hi)` in place, NaN kept (Gemma-4's audio conformer clips its
    /// activations and its linears' inputs and outputs). Errors when `lo > hi`.
    fn clamp(&self, x: &mut Self::Buffer, lo: f32, hi: f32) -> Result<()>;

    /// Causal depthwise convolution over frames, f32: `out[t, c] = sum_j w[c, j] *
    /// x[t - kernel + 1 + j, c]` for `x`, `out` `[frames, channels]` and `w`
    /// `[channels, kernel]`, frames before the first reading zero.
    fn depthwise_conv1d_causal(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        p: DepthwiseConv,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Gemma-4's audio attention, f32 (`q`, `k`, `v`, `out` `[frames, heads * d]`, the
    /// scales already applied; `rel_k` `[positions, heads * d]`, the relative-position
    /// table's keys): queries in blocks of `chunk`, each against the block's `context`
    /// frames, the logit `q . k` plus the relative term transformers reads through its
    /// relative shift, soft-capped, unseen frames at `invalid_logit`, then softmax and the
    /// values' weighted sum (`strata_kernels::cpu::chunked_attention_rows` is the
    /// definition).
    fn chunked_attention(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        rel_k: &Self::Buffer,
        p: ChunkedAttentionParams,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `acc += x`.
    fn add(&self, acc: &mut Self::Buffer, x: &Self::Buffer) -> Result<()>;

    /// `acc *= x` elementwise.
    fn mul(&self, acc: &mut Self::Buffer, x: &Self::Buffer) -> Result<()>;

    /// `x *= s`.
    fn scale(&self, x: &mut Self::Buffer, s: f32) -> Result<()>;

    // ---- attention ----------------------------------------------------------------------

    /// `out [T, n_heads, d]` = softmax-weighted sum of `v` for each query of `q [T, n_heads, d]`
    /// over the keys `k, v [S, n_kv_heads, d]` at absolute positions `k_positions` (see
    /// [`AttentionParams`] for the mask and GQA mapping). A query that sees no key gets zeros.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        q_positions: &[u32],
        k_positions: &[u32],
        p: AttentionParams,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    // ---- paged KV --------------------------------------------------------------------

    /// A zero-filled slab.
    fn kv_slab(&self, shape: KvSlabShape) -> Result<Self::KvSlab>;

    /// The slab's bytes and scales, copied to the host (waits for pending work).
    fn kv_slab_contents(&self, slab: &Self::KvSlab) -> Result<KvSlabContents>;

    /// Copies a host u32 array (slot list, token ids, positions) into a new index of the
    /// same length.
    fn upload_index(&self, index: &[u32]) -> Result<Self::Index>;

    /// Encodes row `t` of `k` and `v` (`[T, num_kv_heads, head_dim]`, activation dtype) into
    /// slot `slots[t]` of `slab`, exactly as `strata_kv::quant::encode_row` does.
    fn kv_store(
        &self,
        slab: &mut Self::KvSlab,
        k: &Self::Buffer,
        v: &Self::Buffer,
        slots: &Self::Index,
    ) -> Result<()>;

    /// Uploads a paged batch (see [`PagedSeq`]); `slots` holds every sequence's key slots.
    fn paged_batch(&self, seqs: &[PagedSeq], slots: &[u32]) -> Result<Self::PagedBatch>;

    /// [`Backend::attention`] with keys and values read from `slab` through `batch`'s slot
    /// table: `q` and `out` are `[T, n_heads, head_dim]` over all the batch's query rows.
    fn paged_attention(
        &self,
        q: &Self::Buffer,
        slab: &Self::KvSlab,
        batch: &Self::PagedBatch,
        p: AttentionParams,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Overwrites an index buffer's contents (same length) in place, keeping its address.
    fn write_index(&self, index: &mut Self::Index, data: &[u32]) -> Result<()>;

    /// [`Backend::paged_batch`] with room for `slot_capacity` slots, so later
    /// [`Backend::paged_batch_update`] calls with the same sequence count keep every
    /// address (what a captured graph needs). Its attention call splits keys as if they
    /// were long, since the grid cannot change between replays.
    fn paged_batch_with_capacity(
        &self,
        seqs: &[PagedSeq],
        slots: &[u32],
        slot_capacity: usize,
    ) -> Result<Self::PagedBatch>;

    /// Rewrites a batch made by [`Backend::paged_batch_with_capacity`] in place: the same
    /// number of sequences and query rows, at most its slot capacity.
    fn paged_batch_update(
        &self,
        batch: &mut Self::PagedBatch,
        seqs: &[PagedSeq],
        slots: &[u32],
    ) -> Result<()>;

    /// [`Backend::paged_batch_update`] with the slots given by pages
    /// ([`crate::expand_page_slots`] says how): a few page ids a sequence instead of a slot
    /// a key, so a device backend can write the slot table where it reads it rather than
    /// receive it from the host. The default expands the slots on the host.
    fn paged_batch_update_pages(
        &self,
        batch: &mut Self::PagedBatch,
        seqs: &[PagedSeq],
        pages: &[u32],
        page_start: &[u32],
        page_size: usize,
    ) -> Result<()> {
        let slots = crate::expand_page_slots(seqs, pages, page_start, page_size)?;
        self.paged_batch_update(batch, seqs, &slots)
    }

    /// [`Backend::embedding`] with the ids in backend memory (checked by the caller).
    fn embedding_idx(
        &self,
        ids: &Self::Index,
        table: &Self::Buffer,
        hidden: usize,
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// [`Backend::embedding_quant`] with the ids in backend memory.
    fn embedding_quant_idx(
        &self,
        ids: &Self::Index,
        table: &Self::QuantMatrix,
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// [`Backend::rope`] with the positions in backend memory.
    fn rope_idx(
        &self,
        x: &mut Self::Buffer,
        positions: &Self::Index,
        inv_freq: &Self::Buffer,
        p: RopeParams,
    ) -> Result<()>;

    /// Per-head RMSNorm (`norm.dim = rope.head_dim`) then RoPE, in place on
    /// `x [T, n_heads, head_dim]`: [`Backend::rms_norm`] followed by [`Backend::rope_idx`].
    fn head_norm_rope_idx(
        &self,
        x: &mut Self::Buffer,
        weight: Option<&Self::Buffer>,
        norm: RmsNormParams,
        at: RopeAt<'_, Self>,
        rope: RopeParams,
    ) -> Result<()> {
        let mut normed = self.scratch(x.len(), x.dtype())?;
        self.rms_norm(x, weight, norm, &mut normed)?;
        self.rope_idx(&mut normed, at.positions, at.inv_freq, rope)?;
        *x = normed;
        Ok(())
    }

    /// [`Backend::head_norm_rope_idx`] on a product in `norm.parts` parts: `x [T, parts,
    /// n_heads * head_dim]` (a [`Backend::matmul_parts`] result, a row's input its parts
    /// added in order in f32 as [`RmsNormParams::parts`] has it), the result into `out [T,
    /// n_heads, head_dim]`.
    fn head_norm_rope_parts_idx(
        &self,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
        weight: Option<&Self::Buffer>,
        norm: RmsNormParams,
        at: RopeAt<'_, Self>,
        rope: RopeParams,
    ) -> Result<()> {
        head_norm_rope_parts_composed(self, x, out, weight, norm, at, rope)
    }

    /// A layer's q, k and v after their projections, in place: q and k through
    /// [`Backend::head_norm_rope_idx`] with `norms[0]` / `norms[1]`, v through the
    /// scale-free per-head norm when `p.v_norm`. One call so a backend can do all three in
    /// one launch.
    fn qkv_norm_rope_idx(
        &self,
        [q, k, v]: [&mut Self::Buffer; 3],
        norms: [&Self::Buffer; 2],
        at: RopeAt<'_, Self>,
        p: QkvPrep,
    ) -> Result<()> {
        self.head_norm_rope_idx(q, Some(norms[0]), p.norm, at, p.rope)?;
        let k_rope = RopeParams {
            n_heads: p.kv_heads,
            ..p.rope
        };
        self.head_norm_rope_idx(k, Some(norms[1]), p.norm, at, k_rope)?;
        if p.v_norm {
            let mut normed = self.scratch(v.len(), v.dtype())?;
            self.rms_norm(v, None, p.norm, &mut normed)?;
            *v = normed;
        }
        Ok(())
    }

    /// [`Backend::qkv_norm_rope_idx`], then k and v into `slab` at `slots` (one a token) as
    /// [`Backend::kv_store`] writes them: one call, so a backend can store from the launch
    /// that prepares them (a KV-owning layer's step).
    fn qkv_norm_rope_store_idx(
        &self,
        [q, k, v]: [&mut Self::Buffer; 3],
        norms: [&Self::Buffer; 2],
        at: RopeAt<'_, Self>,
        p: QkvPrep,
        (slab, slots): (&mut Self::KvSlab, &Self::Index),
    ) -> Result<()> {
        self.qkv_norm_rope_idx([q, &mut *k, &mut *v], norms, at, p)?;
        self.kv_store(slab, k, v, slots)
    }

    /// `out[t, i] = act(gate[t, i]) * table[t * s.stride + s.offset + i]` for `i < s.cols`:
    /// [`Backend::activation`], a strided copy of the table's column slice, and
    /// [`Backend::mul`], in one op.
    fn act_mul_slice(
        &self,
        act: Activation,
        gate: &Self::Buffer,
        table: &Self::Buffer,
        s: TableSlice,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let rows = gate.len().checked_div(s.cols).unwrap_or(0);
        self.activation(act, gate, out)?;
        let mut slice = self.scratch(gate.len(), gate.dtype())?;
        self.copy_strided(
            table,
            &mut slice,
            StridedCopy {
                rows,
                cols: s.cols,
                src_offset: s.offset,
                src_stride: s.stride,
                dst_offset: 0,
                dst_stride: s.cols,
            },
        )?;
        self.mul(out, &slice)
    }

    // ---- graphs ------------------------------------------------------------------------

    /// Whether [`Backend::begin_capture`] can work.
    fn supports_graphs(&self) -> bool {
        false
    }

    /// Starts recording every op queued from this thread instead of running it. Inputs the
    /// recorded ops read must live in buffers whose addresses outlast the graph.
    fn begin_capture(&self) -> Result<()> {
        Err(crate::KernelError::Device(format!(
            "{} has no graphs",
            self.name()
        )))
    }

    /// Stops recording and returns the replayable graph.
    fn end_capture(&self) -> Result<Self::Graph> {
        Err(crate::KernelError::Device(format!(
            "{} has no graphs",
            self.name()
        )))
    }

    /// Runs a captured graph (in order with every other op).
    fn launch_graph(&self, _graph: &Self::Graph) -> Result<()> {
        Err(crate::KernelError::Device(format!(
            "{} has no graphs",
            self.name()
        )))
    }

    // ---- sampling -----------------------------------------------------------------------

    /// The greedy token of each of the first `rows` rows of `logits [.., vocab]` (the
    /// host sampler's `argmax`: ties to the lowest id, NaN as -inf), taken after
    /// `softcap(logits, cap)` when `softcap` is set: each value capped exactly as
    /// [`Backend::softcap`] caps it, the buffer itself left raw (greedy steps need no capped
    /// copy). The default downloads the logits; a device backend sends back only the ids.
    fn argmax_rows(
        &self,
        logits: &Self::Buffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
    ) -> Result<Vec<u32>> {
        crate::error::ensure(
            vocab > 0 && logits.len() >= rows * vocab,
            "argmax_rows",
            || format!("{} logits for {rows} rows of {vocab}", logits.len()),
        )?;
        let n = rows * vocab;
        if n == 0 {
            return Ok(vec![]);
        }
        let host = self.capped_rows(logits, n, softcap)?;
        Ok(host.chunks_exact(vocab).map(sampling::argmax).collect())
    }

    /// The token of each of the first `rows` rows of `logits [.., vocab]` without waiting:
    /// the argmax ([`Backend::argmax_rows`]), except the rows of `draws`, each drawn with
    /// its settings and uniform ([`sampling::sample`] of the softcapped row is the
    /// definition, to the bit), and with its logprobs where it asks for them (at most
    /// [`sampling::MAX_TOP_LOGPROBS`] top ones; [`sampling::token_logprobs`] of the softcapped
    /// row is the definition, to the bit). The ids stay in backend memory (where
    /// [`Backend::feed_tokens`] reads them) and their copy to the host starts;
    /// [`Backend::pick_finish`] waits for it. Ops queued in between run first on the
    /// device, so the host can queue the next step before it reads this one's tokens.
    fn pick_start(
        &self,
        logits: &Self::Buffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<Self::Tokens>;

    /// The picks of a [`Backend::pick_start`], once their copy has landed.
    fn pick_finish(&self, tokens: Self::Tokens) -> Result<Vec<sampling::Picked>>;

    /// [`Backend::pick_start`] on the host: the rows downloaded (capped on the backend
    /// first, as [`Backend::argmax_rows`] does) and picked by [`sampling::pick_rows`].
    fn pick_on_host(
        &self,
        logits: &Self::Buffer,
        vocab: usize,
        rows: usize,
        softcap: Option<f32>,
        draws: &[RowDraw],
    ) -> Result<Vec<sampling::Picked>> {
        crate::error::ensure(
            vocab > 0 && logits.len() >= rows * vocab,
            "pick_rows",
            || format!("{} logits for {rows} rows of {vocab}", logits.len()),
        )?;
        if rows == 0 {
            return Ok(vec![]);
        }
        let host = self.capped_rows(logits, rows * vocab, softcap)?;
        Ok(sampling::pick_rows(&host, vocab, rows, draws)?)
    }

    /// The first `n` logits on the host, softcapped on the backend when `softcap` is set
    /// (the buffer itself left raw).
    fn capped_rows(
        &self,
        logits: &Self::Buffer,
        n: usize,
        softcap: Option<f32>,
    ) -> Result<Vec<f32>> {
        let capped = match softcap {
            Some(cap) => {
                let mut c = self.zeros(n, DType::F32)?;
                let whole = StridedCopy {
                    rows: 1,
                    cols: n,
                    src_offset: 0,
                    src_stride: 0,
                    dst_offset: 0,
                    dst_stride: 0,
                };
                self.copy_strided(logits, &mut c, whole)?;
                self.softcap(&mut c, cap)?;
                Some(c)
            }
            None => None,
        };
        let mut host = self.download(capped.as_ref().unwrap_or(logits))?;
        host.truncate(n);
        Ok(host)
    }

    /// Replaces each id of `ids` marked with [`sampling::FED_TOKEN`] (`FED_TOKEN | r`) by
    /// row `r` of `tokens`, on the backend, in order with the ops around it
    /// ([`sampling::feed_tokens`] is the definition; a mark past the rows becomes 0).
    fn feed_tokens(&self, ids: &mut Self::Index, tokens: &Self::Tokens) -> Result<()>;

    /// Applies each row's logit adjustment (`logit_bias`, then the penalties, then the
    /// `min_tokens` mask) to `logits [.., vocab]` (f32) in place, in order with the ops
    /// around it, so that a later [`Backend::pick_start`] draws from the adjusted rows
    /// ([`sampling::adjust_rows`] is the definition, to the bit). Marked pending tokens
    /// read `fed` (an earlier step's picks, still on the backend), as
    /// [`Backend::feed_tokens`] does.
    fn adjust_logits(
        &self,
        logits: &mut Self::Buffer,
        vocab: usize,
        rows: &[sampling::RowAdjust],
        fed: Option<&Self::Tokens>,
    ) -> Result<()>;

    /// Sets every logit a row's grammar mask disallows to -inf, in `logits [.., vocab]` (f32)
    /// in place, in order with the ops around it ([`sampling::mask_rows`] is the
    /// definition, to the bit).
    fn mask_logits(
        &self,
        logits: &mut Self::Buffer,
        vocab: usize,
        rows: &[sampling::RowMask],
    ) -> Result<()>;

    /// For each row `r` of `c.rows`: [`sampling::clustered_argmax`] of row `r` of `logits`
    /// (`[rows, vocab]`), row `r` of the cluster `scores` (`[rows, clusters]`) and `ordering`
    /// (token ids cluster by cluster), into `out[r]`, in backend memory (a captured draft
    /// step feeds it to the next one).
    fn clustered_argmax(
        &self,
        logits: &Self::Buffer,
        scores: &Self::Buffer,
        ordering: &Self::Index,
        c: ClusterPick,
        out: &mut Self::Index,
    ) -> Result<()>;

    /// An index's values on the host.
    fn download_index(&self, index: &Self::Index) -> Result<Vec<u32>>;
}

/// [`Backend::head_norm_rope_parts_idx`] as the composition of other ops: the parts added
/// into `out` in order (strided copies and adds), then [`Backend::head_norm_rope_idx`] in
/// place. The default, and a backend's fallback where its fused form does not apply.
pub fn head_norm_rope_parts_composed<B: Backend + ?Sized>(
    b: &B,
    x: &B::Buffer,
    out: &mut B::Buffer,
    weight: Option<&B::Buffer>,
    norm: RmsNormParams,
    at: RopeAt<'_, B>,
    rope: RopeParams,
) -> Result<()> {
    let parts = norm.parts;
    let width = rope.n_heads * rope.head_dim;
    let rows = out.len().checked_div(width).unwrap_or(0);
    crate::error::ensure(
        parts > 0 && x.len() == rows * parts * width && out.len() == rows * width,
        "head_norm_rope_parts",
        || {
            format!(
                "{} values in {parts} parts for {} outputs",
                x.len(),
                out.len()
            )
        },
    )?;
    let part = |p: usize, dst: &mut B::Buffer| {
        b.copy_strided(
            x,
            dst,
            StridedCopy {
                rows,
                cols: width,
                src_offset: p * width,
                src_stride: parts * width,
                dst_offset: 0,
                dst_stride: width,
            },
        )
    };
    part(0, out)?;
    if parts > 1 {
        let mut next = b.scratch(out.len(), out.dtype())?;
        for p in 1..parts {
            part(p, &mut next)?;
            b.add(out, &next)?;
        }
    }
    b.head_norm_rope_idx(out, weight, norm.whole(), at, rope)
}
