//! Gemma-4's assistant (MTP drafter): a small decoder that drafts the target's next tokens
//! from the target's last hidden state and the target's own K/V.
//!
//! One draft step (`docs/speculative.md`): the target's scaled embedding of the token and
//! the hidden state, concatenated and projected to the drafter's width; its layers (all
//! reading the target's K/V through the same pool, never writing any); the final norm;
//! the state projected back to the target's width (the next step's hidden state) and the
//! output head, which scores only the tokens of the clusters nearest to the state
//! (`masked_embedding`) when the drafter has one.

use std::path::Path;

use strata_config::{load_assistant_config, AssistantConfig, ModelConfig};
use strata_kernels::sampling::top_clusters;
use strata_kernels::{Backend, ClusterPick, DeviceBuffer, StridedCopy};
use strata_kv::RequestId;
use strata_weights::{GgmlType, ModelWeights, TensorView, WeightSource};

use crate::batch::{ForwardBatch, LogitsMode, SeqChunk};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::linear::{upload_linear_as, Linear, QuantUpload};
use crate::lora::AdapterRuns;
use crate::model::{LoadOptions, Model};

/// A sequence to draft for.
#[derive(Clone, Copy, Debug)]
pub struct DraftSeq {
    /// The KV-pool request holding the target's K/V of positions `0..position`.
    pub request: RequestId,
    /// The position of the token being drafted from (the target's newest token, whose K/V
    /// is not stored yet); every step of a round uses the same one.
    pub position: usize,
}

/// One draft step's result.
pub struct Drafted<B: Backend> {
    /// The greedy draft token of each sequence.
    pub tokens: Vec<u32>,
    /// Each sequence's logits over the vocabulary, when asked for: with a centroid head the
    /// tokens outside the chosen clusters all hold the row's lowest scored value less one.
    pub logits: Option<Vec<Vec<f32>>>,
    /// The state for the next step, `[n, backbone hidden]`.
    pub hidden: B::Buffer,
}

/// The centroid head's clusters.
struct Clusters<B: Backend> {
    /// `[count, hidden]`.
    centroids: Linear<B>,
    /// Token ids grouped by cluster: `count` runs of `vocab / count`, on the host and on
    /// the backend.
    ordering: Vec<u32>,
    ordering_dev: B::Index,
    top_k: usize,
}

/// Gemma-4's assistant model (the MTP drafter), loaded for one target model.
pub struct Assistant<B: Backend> {
    config: AssistantConfig,
    decoder: Model<B>,
    /// `[hidden, 2 * backbone]`.
    pre_projection: Linear<B>,
    /// `[backbone, hidden]`.
    post_projection: Linear<B>,
    clusters: Option<Clusters<B>>,
}

impl<B: QuantUpload + Clone> Assistant<B> {
    /// Loads the drafter at `path` (its directory, `config.json`, or a `gemma4-assistant`
    /// `.gguf`) for `target`, refusing
    /// one whose shapes do not fit the target (the field is named).
    pub fn load(backend: B, path: &Path, target: &ModelConfig, opts: LoadOptions) -> Result<Self> {
        let mut config = load_assistant_config(path)?;
        config.bind(target)?;
        let gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        let source = if gguf || path.is_dir() {
            path
        } else {
            path.parent().unwrap_or(Path::new("."))
        };
        let weights = ModelWeights::open(source, Some("gemma4"), Some(0))?;
        let weight_dtype = opts.weight_dtype;
        let decoder = Model::from_weights_with(backend, config.decoder.clone(), &weights, opts)?;
        let b = &decoder.backend;
        let (ha, hb) = (config.decoder.hidden_size, config.backbone_hidden_size);
        // The drafter's own tensors sit outside the decoder: unprefixed at the top of an HF
        // checkpoint, under their GGUF names (`nextn.*`) in a GGUF.
        let top = |name: &str, shape: &[usize]| -> Result<TensorView<'_>> {
            Ok(if gguf {
                weights.require(name, shape)?
            } else {
                weights.weights().require(name, shape)?
            })
        };
        let lin = |name: &str, shape: &[usize]| -> Result<Linear<B>> {
            upload_linear_as(b, &top(name, shape)?, weight_dtype)
        };
        let pre_projection = lin("pre_projection.weight", &[ha, 2 * hb])?;
        let post_projection = lin("post_projection.weight", &[hb, ha])?;
        let clusters = match config.centroids {
            None => None,
            Some(c) => {
                let vocab = config.decoder.vocab_size;
                let name = "masked_embedding.token_ordering";
                let ordering = token_ordering(&top(name, &[vocab])?, vocab)?;
                Some(Clusters {
                    centroids: lin("masked_embedding.centroids.weight", &[c.count, ha])?,
                    ordering_dev: b.upload_index(&ordering)?,
                    ordering,
                    top_k: c.top_k,
                })
            }
        };
        Ok(Self {
            config,
            decoder,
            pre_projection,
            post_projection,
            clusters,
        })
    }
}

/// The ordering buffer as token ids, each checked to be inside the vocabulary.
fn token_ordering(view: &TensorView<'_>, vocab: usize) -> Result<Vec<u32>> {
    let width = match view.ty {
        GgmlType::I64 => 8,
        GgmlType::I32 => 4,
        other => {
            return Err(ModelError::Invalid(format!(
                "{}: expected integer token ids, found {other:?}",
                view.name
            )))
        }
    };
    view.bytes
        .chunks_exact(width)
        .map(|c| {
            let id = if width == 8 {
                i64::from_le_bytes(c.try_into().expect("8 bytes"))
            } else {
                i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64
            };
            u32::try_from(id)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    ModelError::Invalid(format!(
                        "{}: token id {id} is outside the vocabulary of {vocab}",
                        view.name
                    ))
                })
        })
        .collect()
}

impl<B: Backend> Assistant<B> {
    /// The drafter's configuration.
    pub fn config(&self) -> &AssistantConfig {
        &self.config
    }

    /// Whether a step picks its tokens where the logits are (a centroid head), so that a
    /// round of steps can be captured as a graph.
    pub(crate) fn picks_on_device(&self) -> bool {
        self.clusters.is_some()
    }

    /// `steps` draft steps for each of `seqs` from `tokens` and `hidden` (as
    /// [`Assistant::step`]), each step's tokens feeding the next: per step, each
    /// sequence's draft. A pool that keeps graphs replays the round as one.
    pub fn draft<K: KvCache<B>>(
        &self,
        target: &Model<B>,
        kv: &mut K,
        seqs: &[DraftSeq],
        tokens: &[u32],
        hidden: &B::Buffer,
        steps: usize,
    ) -> Result<Vec<Vec<u32>>> {
        self.check_inputs(seqs, tokens, hidden)?;
        if let Some(round) = kv.draft_round(self, target, seqs, tokens, hidden, steps)? {
            return Ok(round);
        }
        let mut out = Vec::with_capacity(steps);
        let mut tokens = tokens.to_vec();
        let mut state: Option<B::Buffer> = None;
        for _ in 0..steps {
            let h = state.as_ref().unwrap_or(hidden);
            let d = self.step(target, kv, seqs, &tokens, h, false)?;
            tokens.clone_from(&d.tokens);
            out.push(d.tokens);
            state = Some(d.hidden);
        }
        Ok(out)
    }

    /// One token and one `[backbone]` row of `hidden` a sequence, each with target K/V to
    /// draft from.
    fn check_inputs(&self, seqs: &[DraftSeq], tokens: &[u32], hidden: &B::Buffer) -> Result<()> {
        let n = seqs.len();
        let hb = self.config.backbone_hidden_size;
        if tokens.len() != n || hidden.len() != n * hb {
            return Err(ModelError::Invalid(format!(
                "a draft step of {n} sequences got {} tokens and {} hidden values",
                tokens.len(),
                hidden.len()
            )));
        }
        if let Some(s) = seqs.iter().find(|s| s.position == 0) {
            return Err(ModelError::Invalid(format!(
                "request {:?} has no target K/V to draft from",
                s.request
            )));
        }
        Ok(())
    }

    /// One draft step for each of `seqs`: from `tokens` (one a sequence) and `hidden`
    /// (`[n, backbone]`: the target's final-normed state that produced the token, or the
    /// previous step's [`Drafted::hidden`]), over the target's K/V in `kv`.
    pub fn step<K: KvCache<B>>(
        &self,
        target: &Model<B>,
        kv: &mut K,
        seqs: &[DraftSeq],
        tokens: &[u32],
        hidden: &B::Buffer,
        want_logits: bool,
    ) -> Result<Drafted<B>> {
        let d = &self.decoder;
        let b = &d.backend;
        let n = seqs.len();
        self.check_inputs(seqs, tokens, hidden)?;
        let ids = b.upload_index(tokens)?;
        let pos: Vec<u32> = seqs.iter().map(|s| s.position as u32).collect();
        let positions = b.upload_index(&pos)?;
        let batch = draft_batch(seqs, tokens);
        kv.begin_step(b, &batch)?;
        let mut out = b.upload_index(&vec![0; n])?;
        let io = StepIo {
            ids: &ids,
            tokens,
            positions: &positions,
            hidden,
        };
        let (next, y) = self.step_ops(target, kv, &batch, io, &mut out)?;
        let tokens = b.download_index(&out)?;
        let logits = match want_logits {
            true => Some(self.host_logits(&y, n)?),
            false => None,
        };
        Ok(Drafted {
            tokens,
            logits,
            hidden: next,
        })
    }

    /// The ops of one draft step on the pool's current tables (the caller ran `begin_step`
    /// for `batch`, a [`draft_batch`]): each row's token written to `out` where the logits
    /// are, the next state and the final-normed rows returned. With a centroid head nothing
    /// crosses to the host, so a round of steps can be captured as a graph.
    pub(crate) fn step_ops<K: KvCache<B>>(
        &self,
        target: &Model<B>,
        kv: &mut K,
        batch: &ForwardBatch,
        io: StepIo<'_, B>,
        out: &mut B::Index,
    ) -> Result<(B::Buffer, B::Buffer)> {
        let d = &self.decoder;
        let b = &d.backend;
        let n = batch.seqs.len();
        let (ha, hb) = (
            self.config.decoder.hidden_size,
            self.config.backbone_hidden_size,
        );
        let mut cat = d.scratch(n * 2 * hb)?;
        {
            let mut e = d.scratch(n * hb)?;
            let embed = &target.tensors.embed;
            embed.embed_idx(b, io.tokens, io.ids, target.embed_scale, &mut e)?;
            for (src, offset) in [(&e, 0), (io.hidden, hb)] {
                b.copy_strided(
                    src,
                    &mut cat,
                    StridedCopy {
                        rows: n,
                        cols: hb,
                        src_offset: 0,
                        src_stride: hb,
                        dst_offset: offset,
                        dst_stride: 2 * hb,
                    },
                )?;
            }
        }
        let mut x = d.scratch(n * ha)?;
        self.pre_projection.forward(b, &cat, &mut x)?;
        let layers = &d.tensors.layers;
        let mut normed = d.scratch(n * ha)?;
        b.rms_norm(&x, Some(&layers[0].input_norm), d.norm(ha), &mut normed)?;
        for l in 0..layers.len() {
            let at = (io.positions, &AdapterRuns::none());
            d.decoder_layer(l, &mut x, &mut normed, n, at, batch, kv, None)?;
        }
        let mut y = d.scratch(n * ha)?;
        b.rms_norm(&x, Some(&d.tensors.final_norm), d.norm(ha), &mut y)?;
        let mut next = d.scratch(n * hb)?;
        self.post_projection.forward(b, &y, &mut next)?;
        let vocab = self.config.decoder.vocab_size;
        // Every token's logit: one GEMV over the table. Gathering the chosen clusters' rows
        // first would read 1/64 of it, but needs a gather kernel.
        let mut z = d.scratch(n * vocab)?;
        self.table().forward(b, &y, &mut z)?;
        match &self.clusters {
            Some(c) => {
                let count = c.centroids.rows();
                let mut scores = d.scratch(n * count)?;
                c.centroids.forward(b, &y, &mut scores)?;
                let pick = ClusterPick {
                    rows: n,
                    vocab,
                    clusters: count,
                    top_k: c.top_k,
                };
                b.clustered_argmax(&z, &scores, &c.ordering_dev, pick, out)?;
            }
            None => {
                let tokens = b.argmax_rows(&z, vocab, n, None)?;
                b.write_index(out, &tokens)?;
            }
        }
        Ok((next, y))
    }

    /// The output table `[vocab, hidden]` (the tied embedding unless one is stored).
    fn table(&self) -> &Linear<B> {
        let t = &self.decoder.tensors;
        t.lm_head.as_ref().unwrap_or(&t.embed)
    }

    /// The reference's logits for the final-normed rows `y`: with a centroid head, the
    /// searched tokens' own and the row's lowest of them less one everywhere else.
    fn host_logits(&self, y: &B::Buffer, n: usize) -> Result<Vec<Vec<f32>>> {
        let d = &self.decoder;
        let b = &d.backend;
        let vocab = self.config.decoder.vocab_size;
        let mut z = d.scratch(n * vocab)?;
        self.table().forward(b, y, &mut z)?;
        let z = b.download(&z)?;
        let Some(c) = &self.clusters else {
            return Ok(z.chunks(vocab).map(<[f32]>::to_vec).collect());
        };
        let count = c.centroids.rows();
        let mut scores = d.scratch(n * count)?;
        c.centroids.forward(b, y, &mut scores)?;
        let scores = b.download(&scores)?;
        let per = vocab / count;
        Ok((0..n)
            .map(|r| {
                let row = &z[r * vocab..(r + 1) * vocab];
                let cand: Vec<u32> = top_clusters(&scores[r * count..(r + 1) * count], c.top_k)
                    .iter()
                    .flat_map(|&k| c.ordering[k * per..(k + 1) * per].iter().copied())
                    .collect();
                let lowest = cand
                    .iter()
                    .map(|&t| row[t as usize])
                    .fold(f32::INFINITY, f32::min);
                let mut full = vec![lowest - 1.0; vocab];
                for &t in &cand {
                    full[t as usize] = row[t as usize];
                }
                full
            })
            .collect())
    }
}

/// A draft step's inputs in backend memory (a captured round's own buffers).
pub(crate) struct StepIo<'a, B: Backend> {
    pub ids: &'a B::Index,
    /// The host copy of `ids`, read only by host-resident embedding tables.
    pub tokens: &'a [u32],
    /// Each sequence's drafting position (RoPE).
    pub positions: &'a B::Index,
    /// `[n, backbone]`.
    pub hidden: &'a B::Buffer,
}

/// The batch a draft step's attention sees: one token a sequence at `position - 1`, so its
/// keys are every stored position and none of the drafted ones (the query itself is roped
/// at `position`).
pub(crate) fn draft_batch(seqs: &[DraftSeq], tokens: &[u32]) -> ForwardBatch {
    ForwardBatch {
        embeds: Vec::new(),
        seqs: seqs
            .iter()
            .zip(tokens)
            .map(|(s, &t)| SeqChunk {
                request: s.request,
                tokens: vec![t],
                start: s.position - 1,
                logits: LogitsMode::None,
            })
            .collect(),
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    }
}
