//! The forward pass: one code path for Gemma-4, Gemma-3, Llama and Qwen3, with the
//! architecture's switches read from `ModelConfig`.

use strata_config::{Activation as CfgActivation, LayerConfig, RopeStyle as CfgRopeStyle};
use strata_kernels::sampling::{RowAdjust, RowDraw, RowMask, FED_TOKEN};
use strata_kernels::{
    lora_slot_index, Activation, AttentionParams, Backend, DeviceBuffer, HostSlice, QkvPrep,
    ResidualStep, RmsNormParams, RopeAt, RopeParams, RopeStyle, StridedCopy, TableSlice,
};

use crate::batch::{ForwardBatch, ForwardOutput, LogitsMode, SeqChunk};
use crate::error::{ModelError, Result};
use crate::kv_cache::{copy_rows, KvCache};
use crate::launch::{all_picked, Launched};
use crate::linear::Linear;
use crate::lora::{AdapterRuns, Slots, Target};
use crate::model::Model;
use crate::tensors::LayerTensors;

/// Where each sequence's rows sit in the batch's token-major buffers.
pub(crate) struct SeqRows {
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// A batch checked and flattened on the host.
pub(crate) struct Prepared {
    pub(crate) ids: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    pub(crate) rows: Vec<SeqRows>,
}

/// Where a step's final-normed rows (what the output projection reads) go, when wanted.
pub(crate) enum HiddenOut<'a, B: Backend> {
    /// Handed over as they are.
    Keep(&'a mut Option<B::Buffer>),
    /// Copied into this buffer of exactly their size (a graph's own).
    Into(&'a mut B::Buffer),
}

/// The step's token ids and positions in backend memory (fixed addresses for a graph).
pub(crate) struct StepInputs<B: Backend> {
    pub(crate) ids: B::Index,
    pub(crate) positions: B::Index,
    /// Each row's LoRA slot, where a captured step owns it (`None`: the step's own, from
    /// its batch).
    pub(crate) lora: Option<B::Index>,
}

/// The draws of a step whose sequences each have one row of logits, in batch order: the
/// `Draw` sequences' rows (the `Argmax` ones take the argmax).
pub(crate) fn row_draws(batch: &ForwardBatch) -> Vec<RowDraw> {
    batch
        .seqs
        .iter()
        .enumerate()
        .filter_map(|(row, s)| match s.logits {
            LogitsMode::Draw {
                params,
                uniform,
                logprobs,
            } => Some(RowDraw {
                row,
                params,
                uniform,
                logprobs,
            }),
            _ => None,
        })
        .collect()
}

impl<B: Backend> Model<B> {
    pub(crate) fn norm(&self, dim: usize) -> RmsNormParams {
        RmsNormParams {
            dim,
            eps: self.config.rms_norm_eps as f32,
            weight_offset: self.config.norm_weight_offset,
            parts: 1,
        }
    }

    /// An activation buffer the next op writes in full (no zero fill on a device).
    pub(crate) fn scratch(&self, len: usize) -> Result<B::Buffer> {
        Ok(self.backend.scratch(len, self.backend.activation_dtype())?)
    }

    /// `residual = (residual + rms_norm(y)) * scale` (the layer scalar, when given); with
    /// `next` (the next layer's input norm) also `normed = rms_norm(residual, next)`, in the
    /// same step.
    /// `y` may come in `parts` parts (`[T, parts, H]`), which the norm adds.
    #[allow(clippy::too_many_arguments)]
    fn norm_add(
        &self,
        residual: &mut B::Buffer,
        y: &B::Buffer,
        parts: usize,
        weight: &B::Buffer,
        scale: Option<f32>,
        next: Option<&B::Buffer>,
        normed: &mut B::Buffer,
    ) -> Result<()> {
        let b = &self.backend;
        let p = self.norm(self.config.hidden_size).with_parts(parts);
        let (w, s) = (Some(weight), scale.unwrap_or(1.0));
        let step = match next {
            Some(n) => ResidualStep::norm_add_norm(w, s, Some(n), normed),
            None => ResidualStep::norm_then_add(w, s),
        };
        Ok(b.residual_norm(residual, y, p, step)?)
    }

    /// As [`Self::norm_add`] for a layer without a post-norm: `residual += y` (then scaled).
    /// `y` comes in parts only where the next layer's input norm takes the add.
    fn add_residual(
        &self,
        residual: &mut B::Buffer,
        y: &B::Buffer,
        parts: usize,
        scale: Option<f32>,
        next: Option<&B::Buffer>,
        normed: &mut B::Buffer,
    ) -> Result<()> {
        let (b, p) = (&self.backend, self.norm(self.config.hidden_size));
        if let (None, Some(n)) = (scale, next) {
            let step = ResidualStep::add_then_norm(Some(n), normed);
            b.residual_norm(residual, y, p.with_parts(parts), step)?;
            return Ok(());
        }
        if parts != 1 {
            return Err(crate::error::ModelError::Invalid(format!(
                "an MLP output in {parts} parts with no norm to add them"
            )));
        }
        b.add(residual, y)?;
        if let Some(s) = scale {
            b.scale(residual, s)?;
        }
        if let Some(n) = next {
            b.rms_norm(residual, Some(n), p, normed)?;
        }
        Ok(())
    }

    /// Runs every sequence of `batch` through the model, storing their K/V in `kv` and
    /// returning the logits each asked for. A KV cache that can replay a captured graph
    /// for the batch (decode steps on the GPU) does so; everything else runs op by op.
    pub fn forward<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput> {
        let step = self.launch(kv, batch, None)?;
        self.finish(step)
    }

    /// [`Model::launch`] once its fed tokens are checked: `fed` holds the earlier step's
    /// greedy ids when some of `batch`'s tokens are marked as theirs.
    pub(crate) fn launch_checked<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
        fed: Option<&B::Tokens>,
    ) -> Result<Launched<B>> {
        let b = &self.backend;
        let prep = self.prepare(batch)?;
        if prep.ids.is_empty() {
            return Ok(Launched::done(ForwardOutput::empty(
                self.config.vocab_size,
                0,
            )));
        }
        if let Some(step) = kv.replay_decode(self, batch, &prep, fed)? {
            return Ok(step);
        }
        kv.begin_step(b, batch)?;
        let mut inputs = StepInputs {
            ids: b.upload_index(&prep.ids)?,
            positions: b.upload_index(&prep.positions)?,
            lora: None,
        };
        if let Some(tokens) = fed {
            b.feed_tokens(&mut inputs.ids, tokens)?;
        }
        let (logits, counts) = self.run(kv, batch, &prep, &inputs, None, None)?;
        match logits {
            Some(mut logits) if all_picked(batch) => self.start_picks(&mut logits, batch, fed),
            logits if !batch.masked.is_empty() => Ok(Launched::held(logits, counts, batch)),
            logits => Ok(Launched::done(
                self.download_logits(logits, &counts, batch, fed)?,
            )),
        }
    }

    /// The tokens of a step whose sequences all want one (greedy or drawn), from the first
    /// rows of `logits` (one a sequence; adjusted in place where `batch.adjust` asks),
    /// left on the backend with their copy to the host started.
    pub(crate) fn start_picks(
        &self,
        logits: &mut B::Buffer,
        batch: &ForwardBatch,
        fed: Option<&B::Tokens>,
    ) -> Result<Launched<B>> {
        if !batch.masked.is_empty() {
            // Its rows wait for their masks: kept (a graph's buffer is rewritten by the
            // next replay) until `pick_masked`.
            let n = batch.seqs.len() * self.config.vocab_size;
            let b = &self.backend;
            let mut rows = b.scratch(n, b.activation_dtype())?;
            crate::decode_graph::copy_prefix(b, logits, &mut rows, n)?;
            return Ok(Launched::held(Some(rows), vec![1; batch.seqs.len()], batch));
        }
        self.start_picks_masked(logits, batch, fed, &[])
    }

    /// [`Model::start_picks`] with `masks` applied before the picks.
    pub(crate) fn start_picks_masked(
        &self,
        logits: &mut B::Buffer,
        batch: &ForwardBatch,
        fed: Option<&B::Tokens>,
        masks: &[RowMask],
    ) -> Result<Launched<B>> {
        let vocab = self.config.vocab_size;
        let rows = batch.seqs.len();
        let draws = row_draws(batch);
        let cap = self.prepare_picks(logits, batch.adjust.clone(), masks, fed)?;
        let tokens = self.backend.pick_start(logits, vocab, rows, cap, &draws)?;
        Ok(Launched::picked(tokens, vocab, rows))
    }

    /// Applies `adjust`, then `masks` (rows of `logits`) after the final softcap, in place;
    /// returns the softcap the pick must still apply (none once the rows are capped here).
    /// Capping with the same op as the host path, then adjusting, masking and picking
    /// uncapped, draws what the host draws from the downloaded row.
    pub(crate) fn prepare_picks(
        &self,
        logits: &mut B::Buffer,
        adjust: Vec<RowAdjust>,
        masks: &[RowMask],
        fed: Option<&B::Tokens>,
    ) -> Result<Option<f32>> {
        let cap = self.final_softcap();
        if adjust.is_empty() && masks.is_empty() {
            return Ok(cap);
        }
        if let Some(c) = cap {
            self.backend.softcap(logits, c)?;
        }
        let vocab = self.config.vocab_size;
        self.backend.adjust_logits(logits, vocab, &adjust, fed)?;
        self.backend.mask_logits(logits, vocab, masks)?;
        Ok(None)
    }

    /// Checks `batch` and flattens its ids and positions.
    pub(crate) fn prepare(&self, batch: &ForwardBatch) -> Result<Prepared> {
        let c = &self.config;
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut rows = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            if s.tokens.is_empty() {
                return Err(ModelError::Invalid("a sequence chunk has no tokens".into()));
            }
            // Fed marks (checked by `launch`) stand for ids the backend fills in.
            let outside = |&&t: &&u32| t & FED_TOKEN == 0 && t as usize >= c.vocab_size;
            if let Some(&bad) = s.tokens.iter().find(outside) {
                return Err(ModelError::Invalid(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    c.vocab_size
                )));
            }
            let end = s.start + s.tokens.len();
            if end > c.max_position_embeddings {
                return Err(ModelError::Invalid(format!(
                    "position {end} exceeds the context of {}",
                    c.max_position_embeddings
                )));
            }
            rows.push(SeqRows {
                offset: ids.len(),
                len: s.tokens.len(),
            });
            ids.extend_from_slice(&s.tokens);
            positions.extend((s.start..end).map(|p| p as u32));
        }
        if !c.placeholder_ids.is_empty() {
            let pad = c.pad_token_id.unwrap_or(0);
            ids.iter_mut()
                .filter(|t| c.placeholder_ids.contains(t))
                .for_each(|t| *t = pad);
        }
        // Rows given as embeddings look up the pad token, as transformers embeds a
        // placeholder: their per-layer inputs are the pad token's.
        let h = c.hidden_size;
        for e in &batch.embeds {
            let seq = rows.get(e.seq).ok_or_else(|| {
                ModelError::Invalid(format!(
                    "embeddings for sequence {} of {}",
                    e.seq,
                    rows.len()
                ))
            })?;
            let n = e.values.len() / h;
            if n == 0 || n * h != e.values.len() || e.first + n > seq.len {
                return Err(ModelError::Invalid(format!(
                    "{} embedding values at row {} of a chunk of {} rows (width {h})",
                    e.values.len(),
                    e.first,
                    seq.len
                )));
            }
            let pad = c.pad_token_id.unwrap_or(0);
            ids[seq.offset + e.first..seq.offset + e.first + n].fill(pad);
        }
        Ok(Prepared {
            ids,
            positions,
            rows,
        })
    }

    /// The LoRA products of `batch`'s rows, their slots uploaded for the step.
    fn step_loras(&self, batch: &ForwardBatch) -> Result<AdapterRuns<'_, B>> {
        let slots = match self.loras.slots_for(&self.backend, batch)? {
            Some(v) => Some(Slots::Owned(
                self.backend.upload_index(&lora_slot_index(&v))?,
            )),
            None => None,
        };
        Ok(self.loras.runs(slots))
    }

    /// Every layer and the selected rows' logits, left in backend memory (`None` when no
    /// sequence wants logits, or when they went `into` the caller's buffer, which must hold
    /// exactly them), with the row count per sequence. Touches the host only for
    /// host-resident embedding tables, so it can be captured as a graph otherwise.
    pub(crate) fn run<K: KvCache<B>>(
        &self,
        kv: &mut K,
        batch: &ForwardBatch,
        prep: &Prepared,
        inputs: &StepInputs<B>,
        into: Option<&mut B::Buffer>,
        hidden: Option<HiddenOut<'_, B>>,
    ) -> Result<(Option<B::Buffer>, Vec<usize>)> {
        let c = &self.config;
        let b = &self.backend;
        let h = c.hidden_size;
        let t = prep.ids.len();
        let rows = &prep.rows;
        let mut x = self.scratch(t * h)?;
        self.tensors
            .embed
            .embed_idx(b, &prep.ids, &inputs.ids, self.embed_scale, &mut x)?;
        for e in &batch.embeds {
            // Checked by `prepare`.
            let n = e.values.len() / h;
            let src = b.upload(HostSlice::F32(&e.values))?;
            let c = StridedCopy {
                rows: n,
                cols: h,
                src_offset: 0,
                src_stride: h,
                dst_offset: (rows[e.seq].offset + e.first) * h,
                dst_stride: h,
            };
            b.copy_strided(&src, &mut x, c)?;
        }
        let mut ple = match &self.tensors.ple {
            Some(_) => Some(self.per_layer_inputs(&prep.ids, inputs, &x)?),
            None => None,
        };
        let layers = &self.tensors.layers;
        let mut normed = self.scratch(t * h)?;
        if let Some(first) = layers.first() {
            b.rms_norm(&x, Some(&first.input_norm), self.norm(h), &mut normed)?;
        }
        let trim = self.trim_plan(batch, prep);
        let mut trimmed: Option<Trimmed<B>> = None;
        // Each row's LoRA slot, once a step (and again for the rows a trim keeps).
        let mut loras = match &inputs.lora {
            Some(slots) => self.loras.runs(Some(Slots::Borrowed(slots))),
            None => self.step_loras(batch)?,
        };
        for l in 0..layers.len() {
            if let Some((_, keep)) = trim.as_ref().filter(|(at, _)| *at == l) {
                if keep.is_empty() {
                    // No sequence wants logits: the layers left change nothing stored.
                    break;
                }
                let tr = self.trim(batch, prep, keep, &mut x, &mut normed, &mut ple)?;
                kv.begin_step(b, &tr.batch)?;
                // The set's read lock goes before the trimmed rows' slots are made.
                drop(loras);
                loras = self.step_loras(&tr.batch)?;
                trimmed = Some(tr);
            }
            let (batch, positions, t) = match &trimmed {
                Some(tr) => (&tr.batch, &tr.positions, tr.batch.seqs.len()),
                None => (batch, &inputs.positions, t),
            };
            let ple_rows = ple.as_ref();
            let at = (positions, &loras);
            self.decoder_layer(l, &mut x, &mut normed, t, at, batch, kv, ple_rows)?;
        }
        let (wanted, counts) = match &trimmed {
            // One row a sequence that wants logits, in batch order.
            Some(tr) => (
                (0..tr.batch.seqs.len()).collect(),
                batch
                    .seqs
                    .iter()
                    .map(|s| usize::from(s.logits != LogitsMode::None))
                    .collect(),
            ),
            None => wanted_rows(batch, rows),
        };
        self.logits(&x, &wanted, counts, into, hidden)
    }

    /// Layer `l` over the batch's `t` rows at `positions`, with the step's LoRA adapters
    /// `loras`: attention, MLP and (Gemma-4) the per-layer-input step. `x` is the residual
    /// stream; `normed` holds `x` under this layer's input norm on entry and under the next
    /// layer's (when there is one) on return.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decoder_layer<K: KvCache<B>>(
        &self,
        l: usize,
        x: &mut B::Buffer,
        normed: &mut B::Buffer,
        t: usize,
        (positions, loras): (&B::Index, &AdapterRuns<B>),
        batch: &ForwardBatch,
        kv: &mut K,
        ple: Option<&B::Buffer>,
    ) -> Result<()> {
        let c = &self.config;
        let b = &self.backend;
        let h = c.hidden_size;
        let layers = &self.tensors.layers;
        let (lc, lw) = (&c.layers[l], &layers[l]);
        // The layer's last residual step also norms the next layer's input.
        let next = layers.get(l + 1).map(|n| &n.input_norm);
        // The o and down products go only into a residual norm, which can add their parts.
        let at = (positions, loras);
        let (attn, parts) = self.attention(l, lc, lw, normed, t, at, batch, kv)?;
        let p = self.norm(h).with_parts(parts);
        let pre_mlp = Some(&lw.pre_mlp_norm);
        let step = match &lw.post_attn_norm {
            Some(post) => ResidualStep::norm_add_norm(Some(post), 1.0, pre_mlp, normed),
            None => ResidualStep::add_then_norm(pre_mlp, normed),
        };
        b.residual_norm(x, &attn, p, step)?;
        // The layer scalar multiplies the residual after the layer's last add; it is
        // folded into that add's kernel where there is a norm to fold it into.
        let scalar = c.layer_scalar.then_some(lw.layer_scalar);
        let ple_step = ple.zip(lw.ple.as_ref());
        let (mlp_scalar, mlp_next) = if ple_step.is_some() {
            (None, None)
        } else {
            (scalar, next)
        };
        // Without a post-norm the MLP's output is added as it is unless the next layer's
        // input norm takes that add (`add_residual`).
        let normed_after =
            lw.post_mlp_norm.is_some() || (mlp_scalar.is_none() && mlp_next.is_some());
        let (m, parts) = self.mlp(l, lw, normed, t, normed_after, loras)?;
        match &lw.post_mlp_norm {
            Some(post) => self.norm_add(x, &m, parts, post, mlp_scalar, mlp_next, normed)?,
            None => self.add_residual(x, &m, parts, mlp_scalar, mlp_next, normed)?,
        }
        if let Some((ple, (gate, proj, norm))) = ple_step {
            let p = gate.rows();
            let mut ga = self.scratch(t * p)?;
            let slice = TableSlice {
                cols: p,
                offset: l * p,
                stride: c.num_layers() * p,
            };
            gate.forward_gated_slice(b, self.activation(), x, ple, slice, &mut ga)?;
            let mut out = self.scratch(t * h)?;
            proj.forward(b, &ga, &mut out)?;
            self.norm_add(x, &out, 1, norm, scalar, next, normed)?;
        }
        Ok(())
    }

    /// Where this step may drop rows, and the rows it keeps: Gemma-4's KV-shared layers
    /// (the top of the stack) store nothing, so past the first of them a row matters only
    /// if its own logits are wanted. For a prefill that is one row a sequence instead of
    /// the whole prompt (none for a chunk that is not the last). `None` when the model
    /// has no such layers, trimming is off, a sequence wants every row's logits, or every
    /// row is wanted anyway (decode steps).
    fn trim_plan(&self, batch: &ForwardBatch, prep: &Prepared) -> Option<(usize, Vec<usize>)> {
        let first_shared = self.first_trimmed_layer()?;
        if batch.seqs.iter().any(|s| s.logits == LogitsMode::All) {
            return None;
        }
        let keep: Vec<usize> = batch
            .seqs
            .iter()
            .zip(&prep.rows)
            .filter(|(s, _)| s.logits != LogitsMode::None)
            .map(|(_, r)| r.offset + r.len - 1)
            .collect();
        (keep.len() < prep.ids.len()).then_some((first_shared, keep))
    }

    /// Narrows the step to the rows `keep` (each a sequence's last row, in batch order):
    /// the residual stream, the next layer's normed input and the per-layer inputs are
    /// gathered, and the batch and positions rebuilt for those rows alone (the layers left
    /// read no token ids).
    fn trim(
        &self,
        batch: &ForwardBatch,
        prep: &Prepared,
        keep: &[usize],
        x: &mut B::Buffer,
        normed: &mut B::Buffer,
        ple: &mut Option<B::Buffer>,
    ) -> Result<Trimmed<B>> {
        let b = &self.backend;
        let h = self.config.hidden_size;
        *x = self.gather_rows(x, keep, h)?;
        *normed = self.gather_rows(normed, keep, h)?;
        if let Some(p) = ple.as_mut() {
            let cols = p.len() / prep.ids.len();
            *p = self.gather_rows(p, keep, cols)?;
        }
        let seqs = batch
            .seqs
            .iter()
            .filter(|s| s.logits != LogitsMode::None)
            .map(|s| SeqChunk {
                request: s.request,
                tokens: s.tokens[s.tokens.len() - 1..].to_vec(),
                start: s.start + s.tokens.len() - 1,
                logits: s.logits,
            })
            .collect();
        let adapters = match batch.has_adapters() {
            true => (0..batch.seqs.len())
                .filter(|&i| batch.seqs[i].logits != LogitsMode::None)
                .map(|i| batch.adapter(i))
                .collect(),
            false => Vec::new(),
        };
        let positions: Vec<u32> = keep.iter().map(|&r| prep.positions[r]).collect();
        Ok(Trimmed {
            batch: ForwardBatch {
                embeds: Vec::new(),
                seqs,
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters,
            },
            positions: b.upload_index(&positions)?,
        })
    }

    /// The rows `rows` of a token-major buffer of `cols` columns, in that order.
    fn gather_rows(&self, src: &B::Buffer, rows: &[usize], cols: usize) -> Result<B::Buffer> {
        let mut out = self.scratch(rows.len() * cols)?;
        // One copy per run of consecutive rows (a batch's decode rows are one run).
        for (from, to, len) in row_runs(rows) {
            copy_rows(&self.backend, src, &mut out, len, cols, from, to)?;
        }
        Ok(out)
    }

    fn activation(&self) -> Activation {
        match self.config.activation {
            CfgActivation::GeluTanh => Activation::GeluTanh,
            CfgActivation::Silu => Activation::Silu,
        }
    }

    /// Gemma-4 PLE: `[T, L * P]` = (norm(W_plp x0 / sqrt(H)) + E_ple[id] * sqrt(P)) / sqrt(2).
    fn per_layer_inputs(
        &self,
        ids: &[u32],
        inputs: &StepInputs<B>,
        x0: &B::Buffer,
    ) -> Result<B::Buffer> {
        let b = &self.backend;
        let ple = self.tensors.ple.as_ref().expect("checked by caller");
        let p = self
            .config
            .per_layer_input
            .expect("PLE tensors imply PLE config")
            .hidden_size;
        let t = ids.len();
        let lp = ple.projection.rows();
        let mut tok = self.scratch(t * lp)?;
        ple.table
            .embed_idx(b, ids, &inputs.ids, self.ple_scale, &mut tok)?;
        let mut ctx = self.scratch(t * lp)?;
        ple.projection.forward(b, x0, &mut ctx)?;
        b.scale(&mut ctx, (self.config.hidden_size as f32).powf(-0.5))?;
        // tok = (tok + norm(ctx)) / sqrt(2): one fused pass instead of a norm, an add and a
        // scale over [T, L * P] (the sum's operands commute, so the bits are the chain's).
        let step = ResidualStep::norm_then_add(Some(&ple.norm), std::f32::consts::FRAC_1_SQRT_2);
        b.residual_norm(&mut tok, &ctx, self.norm(p), step)?;
        Ok(tok)
    }

    fn rope_params(&self, lc: &LayerConfig, n_heads: usize) -> RopeParams {
        RopeParams {
            n_heads,
            head_dim: lc.head_dim,
            style: match lc.rope.style {
                CfgRopeStyle::Neox => RopeStyle::Neox,
                CfgRopeStyle::Interleaved => RopeStyle::Interleaved,
            },
        }
    }

    /// The optional per-head norm, then RoPE, in place (one fused op when both apply).
    fn norm_rope(
        &self,
        x: &mut B::Buffer,
        norm: Option<&B::Buffer>,
        lc: &LayerConfig,
        n_heads: usize,
        positions: &B::Index,
        inv_freq: &B::Buffer,
    ) -> Result<()> {
        let b = &self.backend;
        let rope = self.rope_params(lc, n_heads);
        match norm {
            Some(w) => {
                let at = RopeAt {
                    positions,
                    inv_freq,
                };
                b.head_norm_rope_idx(x, Some(w), self.norm(lc.head_dim), at, rope)?
            }
            None => b.rope_idx(x, positions, inv_freq, rope)?,
        }
        Ok(())
    }

    /// `lin`'s product of `x` (`t` rows). With `split` (its only reader is a norm that adds
    /// parts: a residual norm, or a KV-shared layer's head norm of q) it is split over k
    /// where the backend gains from it ([`Backend::matmul_k_parts`]). Returns the result
    /// (`[t, parts, rows]`) and its part count.
    fn project(
        &self,
        lin: &Linear<B>,
        x: &B::Buffer,
        t: usize,
        split: bool,
    ) -> Result<(B::Buffer, usize)> {
        let (b, n) = (&self.backend, lin.rows());
        if let (true, Linear::Dense { w, .. }) = (split, lin) {
            let parts = b.matmul_k_parts(w, lin.shape(), t);
            if parts > 1 {
                let mut out = self.scratch(t * parts * n)?;
                b.matmul_parts(x, w, lin.shape(), parts, &mut out)?;
                return Ok((out, parts));
            }
        }
        let mut out = self.scratch(t * n)?;
        lin.forward(b, x, &mut out)?;
        Ok((out, 1))
    }

    /// Self-attention of layer `l` for the whole batch; returns `[T, H]` in the parts the
    /// o projection was split into (see [`Self::project`]), and their count.
    #[allow(clippy::too_many_arguments)]
    fn attention<K: KvCache<B>>(
        &self,
        l: usize,
        lc: &LayerConfig,
        lw: &LayerTensors<B>,
        normed: &B::Buffer,
        t: usize,
        (positions, loras): (&B::Index, &AdapterRuns<B>),
        batch: &ForwardBatch,
        kv: &mut K,
    ) -> Result<(B::Buffer, usize)> {
        let b = &self.backend;
        let c = &self.config;
        let (d, nh, nkv) = (lc.head_dim, c.num_attention_heads, lc.num_kv_heads);
        let head_norm = self.norm(d);

        let q = if let (Some(wk), Some(wv)) = (&lw.k, &lw.v) {
            let mut q = self.scratch(t * nh * d)?;
            let mut k = self.scratch(t * nkv * d)?;
            let mut v = self.scratch(t * nkv * d)?;
            Linear::forward_shared(
                b,
                normed,
                &mut [(&lw.q, &mut q), (wk, &mut k), (wv, &mut v)],
            )?;
            let mut outs = [
                (Target::Q, &mut q),
                (Target::K, &mut k),
                (Target::V, &mut v),
            ];
            loras.add_shared(b, l, normed, t, &mut outs)?;
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                let prep = QkvPrep {
                    norm: head_norm,
                    rope: self.rope_params(lc, nh),
                    kv_heads: nkv,
                    v_norm: c.v_norm,
                };
                let at = RopeAt {
                    positions,
                    inv_freq: &lw.inv_freq,
                };
                let qkv = [&mut q, &mut k, &mut v];
                kv.prepare_and_store(b, l, batch, qkv, [qn, kn], at, prep)?;
            } else {
                self.norm_rope(&mut q, lw.q_norm.as_ref(), lc, nh, positions, &lw.inv_freq)?;
                self.norm_rope(&mut k, lw.k_norm.as_ref(), lc, nkv, positions, &lw.inv_freq)?;
                if c.v_norm {
                    let mut out = self.scratch(t * nkv * d)?;
                    b.rms_norm(&v, None, head_norm, &mut out)?;
                    v = out;
                }
                kv.store(b, l, batch, &k, &v)?;
            }
            q
        } else {
            // A layer that reads another's K/V computes q alone; its only reader is the head
            // norm, which adds a product's parts as it loads them (split over k where the
            // backend gains from it, `Backend::matmul_k_parts`).
            let split = lw.q_norm.is_some() && !loras.touches(l, Target::Q);
            let (mut qp, parts) = self.project(&lw.q, normed, t, split)?;
            loras.add(b, l, Target::Q, normed, t, &mut qp)?;
            match (&lw.q_norm, parts) {
                (Some(qn), 2..) => {
                    let mut q = self.scratch(t * nh * d)?;
                    let rope = self.rope_params(lc, nh);
                    let at = RopeAt {
                        positions,
                        inv_freq: &lw.inv_freq,
                    };
                    let norm = head_norm.with_parts(parts);
                    b.head_norm_rope_parts_idx(&qp, &mut q, Some(qn), norm, at, rope)?;
                    q
                }
                _ => {
                    self.norm_rope(&mut qp, lw.q_norm.as_ref(), lc, nh, positions, &lw.inv_freq)?;
                    qp
                }
            }
        };

        let params = AttentionParams {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            scale: c.attention_scale as f32,
            window: lc.window,
            causal: true,
            softcap: c.attn_logit_softcapping.map(|x| x as f32),
        };
        let mut o = self.scratch(t * nh * d)?;
        // A layer that reads another's K/V (KV-shared, or a drafter's) names that layer.
        kv.attend(b, c.kv_layer_for(l), batch, &q, params, &mut o)?;
        if loras.touches(l, Target::O) {
            let (mut out, parts) = self.project(&lw.o, &o, t, false)?;
            loras.add(b, l, Target::O, &o, t, &mut out)?;
            return Ok((out, parts));
        }
        self.project(&lw.o, &o, t, true)
    }

    /// The gated MLP; returns `[T, H]`, in parts (and their count) when `normed_after`
    /// (a norm reads the result; see [`Self::project`]).
    fn mlp(
        &self,
        l: usize,
        lw: &LayerTensors<B>,
        normed: &B::Buffer,
        t: usize,
        normed_after: bool,
        loras: &AdapterRuns<B>,
    ) -> Result<(B::Buffer, usize)> {
        let b = &self.backend;
        let f = lw.gate.rows();
        let mut act = self.scratch(t * f)?;
        if loras.touches(l, Target::Gate) || loras.touches(l, Target::Up) {
            // The adapters add to gate and up before the activation: unfused.
            let (mut gate, mut up) = (self.scratch(t * f)?, self.scratch(t * f)?);
            lw.gate.forward(b, normed, &mut gate)?;
            lw.up.forward(b, normed, &mut up)?;
            let mut outs = [(Target::Gate, &mut gate), (Target::Up, &mut up)];
            loras.add_shared(b, l, normed, t, &mut outs)?;
            b.act_mul(self.activation(), &gate, &up, &mut act)?;
        } else {
            Linear::forward_gated(b, self.activation(), &lw.gate, &lw.up, normed, &mut act)?;
        }
        if loras.touches(l, Target::Down) {
            let (mut out, parts) = self.project(&lw.down, &act, t, false)?;
            loras.add(b, l, Target::Down, &act, t, &mut out)?;
            return Ok((out, parts));
        }
        self.project(&lw.down, &act, t, normed_after)
    }

    /// Final norm and output projection for the rows each sequence asked for: raw logits,
    /// before the final softcap, which `download_logits` applies (inside the greedy argmax
    /// for the sequences that want only their token).
    /// `wanted` are rows of `x`, `counts` how many of them each sequence owns. With `hidden`,
    /// the selected rows under the final norm (what the output projection reads) go there.
    fn logits(
        &self,
        x: &B::Buffer,
        wanted: &[usize],
        counts: Vec<usize>,
        into: Option<&mut B::Buffer>,
        hidden: Option<HiddenOut<'_, B>>,
    ) -> Result<(Option<B::Buffer>, Vec<usize>)> {
        let b = &self.backend;
        let c = &self.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let n = wanted.len();
        if n == 0 {
            return Ok((None, counts));
        }
        let sel = self.gather_rows(x, wanted, h)?;
        let mut y = self.scratch(n * h)?;
        b.rms_norm(&sel, Some(&self.tensors.final_norm), self.norm(h), &mut y)?;
        let mut own = None;
        let logits = match into {
            Some(dst) if dst.len() == n * vocab => dst,
            Some(dst) => {
                return Err(ModelError::Invalid(format!(
                    "a logits buffer of {} for {n} rows of {vocab}",
                    dst.len()
                )))
            }
            None => own.insert(self.scratch(n * vocab)?),
        };
        self.tensors
            .lm_head
            .as_ref()
            .unwrap_or(&self.tensors.embed)
            .forward(b, &y, logits)?;
        match hidden {
            Some(HiddenOut::Keep(slot)) => *slot = Some(y),
            Some(HiddenOut::Into(dst)) if dst.len() == n * h => copy_rows(b, &y, dst, n, h, 0, 0)?,
            Some(HiddenOut::Into(dst)) => {
                return Err(ModelError::Invalid(format!(
                    "a hidden-state buffer of {} for {n} rows of {h}",
                    dst.len()
                )))
            }
            None => {}
        }
        Ok((own, counts))
    }

    /// The final logit softcap (Gemma), applied where the logits of [`Model::run`] are read.
    pub(crate) fn final_softcap(&self) -> Option<f32> {
        self.config.final_logit_softcapping.map(|c| c as f32)
    }

    /// The logits of [`Model::run`] on the host, softcapped and split per sequence of
    /// `batch` (`counts` rows each); for the sequences that want a token (`Argmax`, `Draw`),
    /// only their token (the logits stay on the backend).
    pub(crate) fn download_logits(
        &self,
        logits: Option<B::Buffer>,
        counts: &[usize],
        batch: &ForwardBatch,
        fed: Option<&B::Tokens>,
    ) -> Result<ForwardOutput> {
        self.download_masked(logits, counts, batch, fed, &[])
    }

    /// [`Model::download_logits`] with `masks` applied before the picks.
    pub(crate) fn download_masked(
        &self,
        logits: Option<B::Buffer>,
        counts: &[usize],
        batch: &ForwardBatch,
        fed: Option<&B::Tokens>,
        masks: &[RowMask],
    ) -> Result<ForwardOutput> {
        let vocab = self.config.vocab_size;
        let mut out = ForwardOutput::empty(vocab, counts.len());
        let Some(mut logits) = logits else {
            return Ok(out);
        };
        let rows: usize = counts.iter().sum();
        // Once adjusted, every row is softcapped already.
        let cap = self.prepare_picks(&mut logits, batch.adjust.clone(), masks, fed)?;
        let picks: Vec<bool> = batch.seqs.iter().map(|s| s.logits.picks()).collect();
        if picks.iter().any(|&p| p) {
            // Each picking sequence's last row; the rows of the others take their argmax,
            // unread.
            let mut draws = Vec::new();
            let mut at = 0;
            for (s, &k) in batch.seqs.iter().zip(counts) {
                if let (
                    LogitsMode::Draw {
                        params,
                        uniform,
                        logprobs,
                    },
                    true,
                ) = (s.logits, k > 0)
                {
                    draws.push(RowDraw {
                        row: at + k - 1,
                        params,
                        uniform,
                        logprobs,
                    });
                }
                at += k;
            }
            let started = self.backend.pick_start(&logits, vocab, rows, cap, &draws)?;
            let mut picked = self.backend.pick_finish(started)?;
            let mut at = 0;
            for (i, &k) in counts.iter().enumerate() {
                if picks[i] && k > 0 {
                    let p = &mut picked[at + k - 1];
                    out.tokens[i] = Some(p.id);
                    out.logprobs[i] = p.logprobs.take();
                }
                at += k;
            }
        }
        let wanted = counts.iter().zip(&picks).any(|(&k, &p)| k > 0 && !p);
        if wanted {
            if let Some(cap) = cap {
                self.backend.softcap(&mut logits, cap)?;
            }
            let host = self.backend.download(&logits)?;
            let mut at = 0;
            for (i, &k) in counts.iter().enumerate() {
                if !picks[i] {
                    out.logits[i] = host[at * vocab..(at + k) * vocab].to_vec();
                }
                at += k;
            }
        }
        Ok(out)
    }
}

/// The rows of the step's buffers whose logits each sequence asked for, and how many
/// each sequence owns.
fn wanted_rows(batch: &ForwardBatch, rows: &[SeqRows]) -> (Vec<usize>, Vec<usize>) {
    let mut wanted = Vec::new();
    let mut counts = Vec::with_capacity(rows.len());
    for (seq, r) in batch.seqs.iter().zip(rows) {
        let before = wanted.len();
        match seq.logits {
            LogitsMode::None => {}
            LogitsMode::Last | LogitsMode::Argmax | LogitsMode::Draw { .. } => {
                wanted.push(r.offset + r.len - 1)
            }
            LogitsMode::All => wanted.extend(r.offset..r.offset + r.len),
        }
        counts.push(wanted.len() - before);
    }
    (wanted, counts)
}

/// A step narrowed to the rows whose logits are wanted (see [`Model::trim_plan`]).
struct Trimmed<B: Backend> {
    batch: ForwardBatch,
    positions: B::Index,
}

/// `rows` as maximal runs of consecutive values: (first row, index in `rows`, length).
fn row_runs(rows: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some((first, _, len)) if *first + *len == r => *len += 1,
            _ => runs.push((r, i, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod row_run_tests {
    use super::row_runs;

    #[test]
    fn consecutive_rows_make_one_run() {
        assert_eq!(row_runs(&[]), vec![]);
        assert_eq!(row_runs(&[0, 1, 2, 3]), vec![(0, 0, 4)]);
        assert_eq!(
            row_runs(&[4, 9, 10, 11, 2]),
            vec![(4, 0, 1), (9, 1, 3), (2, 4, 1)]
        );
    }
}

#[cfg(test)]
mod trim_tests {
    use super::*;
    use strata_kernels::cpu::CpuBackend;
    use strata_kv::RequestId;

    fn chunk(request: u64, start: usize, len: usize, logits: LogitsMode) -> SeqChunk {
        SeqChunk {
            request: RequestId(request),
            tokens: vec![3; len],
            start,
            logits,
        }
    }

    /// Past the tiny Gemma-4's last KV-owning layer (2 of 0..5) a step keeps one row per
    /// sequence that wants logits; decode-only steps, every-row scoring and models
    /// without shared layers keep them all.
    #[test]
    fn the_plan_keeps_each_wanted_sequences_last_row() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny/");
        let mut model =
            Model::load(CpuBackend::new(), format!("{fixtures}gemma4-tiny").as_ref()).unwrap();
        let plan = |m: &Model<CpuBackend>, seqs: Vec<SeqChunk>| {
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs,
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            m.trim_plan(&batch, &m.prepare(&batch).unwrap())
        };
        let mixed = || {
            vec![
                chunk(0, 10, 1, LogitsMode::Argmax),
                chunk(1, 0, 12, LogitsMode::None),
                chunk(2, 0, 9, LogitsMode::Last),
            ]
        };
        assert_eq!(plan(&model, mixed()), Some((3, vec![0, 21])));
        assert_eq!(model.kv_shared_trimmed_layers(), 3);
        let no_logits = vec![chunk(1, 0, 12, LogitsMode::None)];
        assert_eq!(plan(&model, no_logits), Some((3, vec![])));
        let decode = vec![
            chunk(0, 10, 1, LogitsMode::Argmax),
            chunk(1, 4, 1, LogitsMode::Last),
        ];
        assert_eq!(plan(&model, decode), None);
        let mut scoring = mixed();
        scoring[2].logits = LogitsMode::All;
        assert_eq!(plan(&model, scoring), None);
        model.set_kv_shared_trim(false);
        assert_eq!(plan(&model, mixed()), None);
        assert_eq!(model.kv_shared_trimmed_layers(), 0);
        let gemma3 =
            Model::load(CpuBackend::new(), format!("{fixtures}gemma3-tiny").as_ref()).unwrap();
        assert_eq!(plan(&gemma3, mixed()), None);
        assert_eq!(gemma3.kv_shared_trimmed_layers(), 0);
    }
}
