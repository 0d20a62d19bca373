//! Small parameter structs and enums shared by every backend's ops.

/// Which dimensions form a rotated RoPE pair (same meaning as the config crate's enum of
/// the same name; kept here so this crate stands alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)`, "rotate half" (GPT-NeoX; every HF checkpoint).
    Neox,
    /// Pairs `(2i, 2i + 1)` (GGUF Llama, whose converter permuted the q/k rows).
    Interleaved,
}

/// Gated-MLP activation applied to the gate projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// `x * sigmoid(x)` (Llama, Qwen3).
    Silu,
    /// `1 / (1 + e^-x)`: with [`crate::Backend::act_mul`], a GLU (Gemma-4's audio
    /// conformer).
    Sigmoid,
}

/// RMSNorm over consecutive rows of `dim` elements:
/// `y = x * (mean(x^2) + eps)^(-1/2) * (w + weight_offset)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormParams {
    /// Elements a row normalises over (hidden size, or head_dim for per-head norms).
    pub dim: usize,
    /// Added to the mean square before the inverse square root.
    pub eps: f32,
    /// 0 for Gemma-4 / Llama / Qwen3 / GGUF (weights hold the final multiplier), 1 for HF
    /// Gemma-3 checkpoints, whose norms multiply by `1 + w`.
    pub weight_offset: f32,
    /// How many parts the normed input `x` comes in: `[rows, parts, dim]`, a row's input
    /// being its parts added in order in f32 (a product split over k by
    /// [`crate::Backend::matmul_parts`]). 1 for a plain `[rows, dim]` input. Only the
    /// norms' `x` takes parts: a residual or a second norm's input is always whole.
    pub parts: usize,
}

impl RmsNormParams {
    /// A norm over rows of `dim` with `weight_offset` 0 and a whole (one-part) input.
    pub fn new(dim: usize, eps: f32) -> Self {
        Self {
            dim,
            eps,
            weight_offset: 0.0,
            parts: 1,
        }
    }

    /// The same norm over an input of `parts` parts.
    pub fn with_parts(self, parts: usize) -> Self {
        Self { parts, ..self }
    }

    /// The same norm over a whole input (what a fused step's second norm reads).
    pub fn whole(self) -> Self {
        self.with_parts(1)
    }
}

/// The residual step [`crate::Backend::residual_norm`] runs around an RMSNorm; `B` is the
/// backend's buffer. A `None` weight is the scale-free norm.
pub enum ResidualStep<'a, B> {
    /// Pre-norm (Llama, Qwen3, and Gemma where a layer has no post-norm):
    /// `residual += x; out = rms_norm(residual, weight)`.
    AddThenNorm {
        /// The norm's weight.
        weight: Option<&'a B>,
        /// Receives the normed residual.
        out: &'a mut B,
    },
    /// Post-norm (Gemma's sandwich norms): `residual = (residual + rms_norm(x, weight)) *
    /// scale`, then with `next` the next pre-norm, `next.out = rms_norm(residual,
    /// next.weight)`, in the same pass where the backend can.
    NormThenAdd {
        /// The weight of the norm of `x`.
        weight: Option<&'a B>,
        /// Gemma-4's layer scalar; 1 elsewhere.
        scale: f32,
        /// The next norm of the residual, if one follows at once.
        next: Option<NextNorm<'a, B>>,
    },
}

impl<'a, B> ResidualStep<'a, B> {
    /// `residual += x; out = rms_norm(residual, weight)`.
    pub fn add_then_norm(weight: Option<&'a B>, out: &'a mut B) -> Self {
        Self::AddThenNorm { weight, out }
    }

    /// `residual = (residual + rms_norm(x, weight)) * scale`.
    pub fn norm_then_add(weight: Option<&'a B>, scale: f32) -> Self {
        Self::NormThenAdd {
            weight,
            scale,
            next: None,
        }
    }

    /// [`Self::norm_then_add`], then `out = rms_norm(residual, next_weight)`.
    pub fn norm_add_norm(
        weight: Option<&'a B>,
        scale: f32,
        next_weight: Option<&'a B>,
        out: &'a mut B,
    ) -> Self {
        Self::NormThenAdd {
            weight,
            scale,
            next: Some(NextNorm {
                weight: next_weight,
                out,
            }),
        }
    }
}

/// The norm of the updated residual that ends a [`ResidualStep::NormThenAdd`].
pub struct NextNorm<'a, B> {
    /// The norm's weight.
    pub weight: Option<&'a B>,
    /// Receives the normed residual.
    pub out: &'a mut B,
}

/// Layout of a `[tokens, n_heads, head_dim]` activation that RoPE rotates in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeParams {
    /// Heads per token.
    pub n_heads: usize,
    /// Elements per head; the rotated pairs lie within a head.
    pub head_dim: usize,
    /// Which dimensions pair up.
    pub style: RopeStyle,
}

/// A layer's per-head q / k / v preparation ([`crate::Backend::qkv_norm_rope_idx`]): the
/// per-head norm (`norm.dim` = head_dim) for all three, RoPE (`rope`, q's head count) for q
/// and k; k and v have `kv_heads` heads; v is normed only when `v_norm` (no weight).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvPrep {
    /// The per-head norm (`dim` = head_dim) of q, k and (when `v_norm`) v.
    pub norm: RmsNormParams,
    /// RoPE of q (its head count) and k (same head_dim and style, `kv_heads` heads).
    pub rope: RopeParams,
    /// Heads of k and v.
    pub kv_heads: usize,
    /// Whether v is normed too (without a weight).
    pub v_norm: bool,
}

/// `out[T, out_features] = x[T, in_features] * W^T` with `W` stored `[out_features, in_features]`
/// row-major (the HF and GGUF layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    /// Length of each input row (columns of `W`).
    pub in_features: usize,
    /// Length of each output row (rows of `W`).
    pub out_features: usize,
}

/// The stacks of a [`crate::Backend::lora_bgmv`] and the rows it runs over: `slots`
/// adapters' `A [rank, cols]` back to back in one buffer and their `B [out, rank]` in
/// another (an adapter of a smaller rank padded with zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraShape {
    /// Rows of `x` and `out` (one a token of the step).
    pub rows: usize,
    /// Adapters the stacks hold.
    pub slots: usize,
    /// The stacks' rank.
    pub rank: usize,
    /// Input features (columns of `A`).
    pub cols: usize,
    /// Output features (rows of `B`).
    pub out: usize,
}

/// The index a [`crate::Backend::lora_bgmv`] takes for rows with `slots` (`u32::MAX`: no
/// adapter): the slots, then the rows sorted by slot (stable, rows without an adapter last),
/// then the slot at each place of that order. A backend reads the rows in that order so that
/// each adapter's weights are loaded once for all its rows in a tile; each row's result does
/// not depend on the order.
pub fn lora_slot_index(slots: &[u32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..slots.len() as u32).collect();
    order.sort_by_key(|&r| slots[r as usize]);
    let mut index = Vec::with_capacity(3 * slots.len());
    index.extend_from_slice(slots);
    index.extend_from_slice(&order);
    index.extend(order.iter().map(|&r| slots[r as usize]));
    index
}

/// The stacks a [`crate::Backend::lora_bgmv`] reads ([`LoraShape`]): `A`, `B` (one
/// weight dtype) and each slot's scale (F32, `[slots]`).
#[derive(Debug)]
pub struct LoraStacks<'a, Buf> {
    /// `[slots, rank, cols]`.
    pub a: &'a Buf,
    /// `[slots, out, rank]`.
    pub b: &'a Buf,
    /// `[slots]` f32: the factor each slot's product is multiplied by.
    pub scales: &'a Buf,
}

// By hand: derived, they would ask `Buf: Copy`, and only the references are copied.
impl<Buf> Clone for LoraStacks<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Buf> Copy for LoraStacks<'_, Buf> {}

/// One part of a [`crate::Backend::lora_bgmv_shared_input`]: stacks whose products add to
/// `out`, `[rows, out_features]`.
pub struct LoraOut<'a, Buf> {
    /// The part's stacks (`B` is `[slots, out_features, rank]`).
    pub stacks: LoraStacks<'a, Buf>,
    /// Output features of the part.
    pub out_features: usize,
    /// What the part's products add to.
    pub out: &'a mut Buf,
}

/// One product of [`crate::Backend::matmul_shared_input`]: `out = x * w^T` for a dense
/// `w` of `shape`.
pub struct MatmulOut<'a, Buf> {
    /// The weight, `[shape.out_features, shape.in_features]` row-major.
    pub w: &'a Buf,
    /// The product's features.
    pub shape: MatmulShape,
    /// Where the `[T, shape.out_features]` result goes.
    pub out: &'a mut Buf,
}

/// Attention over explicitly positioned keys.
///
/// Key `s` is visible to query `t` iff (`!causal` or `k_pos[s] <= q_pos[t]`) and (`window` is
/// `None` or `q_pos[t] - k_pos[s] < W`). Query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_heads: usize,
    /// Key / value heads; divides `n_heads` (grouped-query attention when fewer).
    pub n_kv_heads: usize,
    /// Elements per head, the same for q, k and v.
    pub head_dim: usize,
    /// Multiplies `q . k` (Gemma-4: exactly 1.0; most others `head_dim^-1/2`).
    pub scale: f32,
    /// Sliding window `W`: keys strictly less than `W` positions behind the query.
    pub window: Option<usize>,
    /// Whether keys after the query's position are hidden.
    pub causal: bool,
    /// `cap * tanh(score / cap)` on the scaled scores before the mask (Gemma-2 style); None
    /// for the models served today.
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// Whether a key at `k_pos` is visible from a query at `q_pos` (the one mask rule).
    #[inline]
    pub fn visible(&self, q_pos: u32, k_pos: u32) -> bool {
        let behind = q_pos as i64 - k_pos as i64;
        (!self.causal || behind >= 0) && self.window.is_none_or(|w| behind < w as i64)
    }
}

/// A clustered output head's greedy pick ([`crate::Backend::clustered_argmax`]): `rows`
/// rows of `vocab` logits, `clusters` scores a row, the best `top_k` clusters searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterPick {
    /// Rows (tokens) to pick for.
    pub rows: usize,
    /// Logits a row; a multiple of `clusters`.
    pub vocab: usize,
    /// Cluster scores a row; each cluster holds `vocab / clusters` token ids.
    pub clusters: usize,
    /// How many of the best-scoring clusters are searched for the largest logit.
    pub top_k: usize,
}

/// A column slice of a row-major table: row `t` holds `cols` values from
/// `t * stride + offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableSlice {
    /// Values taken from each row.
    pub cols: usize,
    /// Column of the first value taken, in elements.
    pub offset: usize,
    /// Elements from one row's start to the next.
    pub stride: usize,
}

/// A 2-D strided copy: `rows` rows of `cols` elements from `src[src_offset + r * src_stride ..]`
/// to `dst[dst_offset + r * dst_stride ..]`. Splits fused projections (q|k|v, gate|up) and
/// gathers per-layer slices without views into buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StridedCopy {
    /// Rows copied.
    pub rows: usize,
    /// Elements copied a row.
    pub cols: usize,
    /// Element index in `src` of the first row's first element.
    pub src_offset: usize,
    /// Elements between consecutive rows' starts in `src`.
    pub src_stride: usize,
    /// Element index in `dst` of the first row's first element.
    pub dst_offset: usize,
    /// Elements between consecutive rows' starts in `dst`.
    pub dst_stride: usize,
}

/// A causal depthwise convolution over frames ([`crate::Backend::depthwise_conv1d_causal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DepthwiseConv {
    /// Channels a frame (each with a filter of its own).
    pub channels: usize,
    /// Taps a filter: frame `t` reads frames `t - kernel + 1 ..= t`.
    pub kernel: usize,
}

/// Chunked local attention with relative positions ([`crate::Backend::chunked_attention`],
/// Gemma-4's audio conformer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkedAttentionParams {
    /// Heads (queries, keys and values alike).
    pub n_heads: usize,
    /// Values a head.
    pub head_dim: usize,
    /// Queries a block.
    pub chunk: usize,
    /// `attention_context_left`: a query sees itself and `left - 2` frames before it.
    pub left: usize,
    /// `attention_context_right`: and `right - 1` frames after it.
    pub right: usize,
    /// Logits are `cap * tanh(logit / cap)`.
    pub logit_cap: f32,
    /// The logit of a frame a query does not see.
    pub invalid_logit: f32,
}

impl DepthwiseConv {
    /// The sizes the op takes: `x` and `out` whole frames of `channels`, `w` one filter of
    /// `kernel` taps a channel.
    pub(crate) fn check_sizes(
        &self,
        op: &'static str,
        x: usize,
        w: usize,
        out: usize,
    ) -> crate::Result<()> {
        crate::error::ensure(
            self.channels > 0
                && self.kernel > 0
                && x.is_multiple_of(self.channels)
                && out == x
                && w == self.channels * self.kernel,
            op,
            || {
                format!(
                    "x {x}, w {w}, out {out} values for {} channels, {} taps",
                    self.channels, self.kernel
                )
            },
        )
    }
}

impl ChunkedAttentionParams {
    /// The sizes the op takes: `q`, `k`, `v`, `out` whole frames of `heads x d`, `rel_k`
    /// one row of them a relative position; a positive cap.
    pub(crate) fn check_sizes(
        &self,
        op: &'static str,
        (q, k, v, rel_k, out): (usize, usize, usize, usize, usize),
    ) -> crate::Result<()> {
        let w = self.n_heads * self.head_dim;
        crate::error::ensure(
            w > 0
                && self.chunk > 0
                && self.left > 0
                && q.is_multiple_of(w)
                && k == q
                && v == q
                && out == q
                && rel_k == self.positions() * w
                && self.logit_cap > 0.0,
            op,
            || {
                format!(
                    "q {q}, k {k}, v {v}, rel_k {rel_k}, out {out} values for {} heads of \
                     {}, {} positions, cap {}",
                    self.n_heads,
                    self.head_dim,
                    self.positions(),
                    self.logit_cap
                )
            },
        )
    }

    /// Frames a block's keys span: `chunk + left - 1 + right`.
    pub fn context(&self) -> usize {
        self.chunk + self.left - 1 + self.right
    }

    /// Rows of the relative-position table: `context / 2 + 1`.
    pub fn positions(&self) -> usize {
        self.context() / 2 + 1
    }
}
