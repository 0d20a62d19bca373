//! The model's weights on a backend, loaded and shape-checked against the configuration.

use strata_config::ModelConfig;
use strata_kernels::{Backend, HostSlice};
use strata_weights::ModelWeights;

use crate::error::{ModelError, Result};
use crate::linear::{upload_linear_as, upload_vector, HostTable, Linear, QuantUpload, QuantWeight};
use crate::model::LoadOptions;

/// One decoder layer's weights.
pub struct LayerTensors<B: Backend> {
    /// RMS norm weight before attention (`[H]`).
    pub input_norm: B::Buffer,
    /// Gemma's norm of the attention output (sandwich norms); absent for Llama/Qwen3.
    pub post_attn_norm: Option<B::Buffer>,
    /// The norm before the MLP (`pre_feedforward_layernorm`, or Llama's
    /// `post_attention_layernorm`).
    pub pre_mlp_norm: B::Buffer,
    /// Gemma's norm of the MLP output (sandwich norms); absent for Llama/Qwen3.
    pub post_mlp_norm: Option<B::Buffer>,
    /// Query projection (`[heads * head_dim, H]`).
    pub q: Linear<B>,
    /// K/V projections: only for layers that own their KV.
    pub k: Option<Linear<B>>,
    /// Value projection; present exactly when `k` is.
    pub v: Option<Linear<B>>,
    /// Attention output projection (`[H, heads * head_dim]`).
    pub o: Linear<B>,
    /// Per-head query RMS norm (`[head_dim]`), for models with QK norms.
    pub q_norm: Option<B::Buffer>,
    /// Per-head key RMS norm (`[head_dim]`), for models with QK norms on layers that own
    /// their KV.
    pub k_norm: Option<B::Buffer>,
    /// MLP gate projection (`[intermediate, H]`).
    pub gate: Linear<B>,
    /// MLP up projection (`[intermediate, H]`).
    pub up: Linear<B>,
    /// MLP down projection (`[H, intermediate]`).
    pub down: Linear<B>,
    /// Gemma-4 per-layer-input gate `[P, H]`, projection `[H, P]` and norm `[H]`.
    pub ple: Option<(Linear<B>, Linear<B>, B::Buffer)>,
    /// Gemma-4's per-layer output scale (`layer_scalar`); 1.0 where the model has none.
    pub layer_scalar: f32,
    /// RoPE inverse frequencies (`head_dim / 2`, f32; zeros pass through).
    pub inv_freq: B::Buffer,
}

/// Gemma-4's per-layer input embeddings.
pub struct PleTensors<B: Backend> {
    /// `[V_ple, L * P]`.
    pub table: Linear<B>,
    /// `[L * P, H]`.
    pub projection: Linear<B>,
    /// `[P]`.
    pub norm: B::Buffer,
}

/// All of a model's weights on a backend.
pub struct ModelTensors<B: Backend> {
    /// Token embedding table (`[V, H]`), in host memory when `LoadOptions::host_embeddings`
    /// asks and it is not tied to the output projection.
    pub embed: Linear<B>,
    /// Gemma-4's per-layer input embeddings.
    pub ple: Option<PleTensors<B>>,
    /// The decoder layers, in order.
    pub layers: Vec<LayerTensors<B>>,
    /// RMS norm weight after the last layer (`[H]`).
    pub final_norm: B::Buffer,
    /// `None` when tied to `embed`.
    pub lm_head: Option<Linear<B>>,
}

impl<B: QuantUpload> ModelTensors<B> {
    /// Uploads `w`'s tensors to `b`, checking each against the shape `c` implies, in the
    /// weight dtype `opts` asks for.
    pub fn load(b: &B, c: &ModelConfig, w: &ModelWeights, opts: &LoadOptions) -> Result<Self> {
        let h = c.hidden_size;
        let lin = |name: &str, shape: &[usize]| -> Result<Linear<B>> {
            if let Some(q) = w.bnb4(name) {
                if q.shape != shape {
                    return Err(ModelError::Invalid(format!(
                        "{name}: bitsandbytes 4-bit matrix of shape {:?}, want {shape:?}",
                        q.shape
                    )));
                }
                let q = crate::bnb4::Bnb4Weight(q.clone());
                return Ok(Linear::Quant(b.upload_bnb4(q)?));
            }
            let view = w.require(name, shape)?;
            if let Some(q) = crate::quantize::at_load(&view, opts.quantize)? {
                return Ok(Linear::Quant(b.upload_quant(q, None)?));
            }
            if crate::linear::is_block_format(view.ty) && opts.keep_blocks {
                return Ok(Linear::Quant(
                    b.upload_quant(QuantWeight::new(&view)?, None)?,
                ));
            }
            upload_linear_as(b, &view, opts.weight_dtype)
        };
        // A table for lookups only, in host memory when asked.
        let table = |name: &str, shape: &[usize], host: bool| -> Result<Linear<B>> {
            if host {
                Ok(Linear::Host(HostTable::new(&w.require(name, shape)?)?))
            } else {
                lin(name, shape)
            }
        };
        let tied = c.tie_word_embeddings || w.is_tied();
        let vec = |name: &str, len: usize| -> Result<B::Buffer> {
            upload_vector(b, &w.require(name, &[len])?)
        };
        // A tied embedding is also the output projection, so it stays on the backend.
        let embed = table(
            "embed_tokens.weight",
            &[c.vocab_size, h],
            opts.host_embeddings && !tied,
        )?;
        let ple = match c.per_layer_input {
            None => None,
            Some(p) => {
                let lp = c.num_layers() * p.hidden_size;
                Some(PleTensors {
                    table: table(
                        "embed_tokens_per_layer.weight",
                        &[p.vocab_size, lp],
                        opts.host_embeddings,
                    )?,
                    projection: lin("per_layer_model_projection.weight", &[lp, h])?,
                    norm: vec("per_layer_projection_norm.weight", p.hidden_size)?,
                })
            }
        };
        // Steps: the embeddings, each layer, the output projection.
        let steps = c.num_layers() + 2;
        let progress = |done: usize| {
            if let Some(p) = &opts.progress {
                p.report(done, steps);
            }
        };
        progress(1);
        let mut layers = Vec::with_capacity(c.num_layers());
        for (l, lc) in c.layers.iter().enumerate() {
            let n = |s: &str| format!("layers.{l}.{s}");
            let (d, nh, nkv, f) = (
                lc.head_dim,
                c.num_attention_heads,
                lc.num_kv_heads,
                lc.intermediate_size,
            );
            let owns = lc.owns_kv();
            let (post_attn_norm, pre_mlp_norm, post_mlp_norm) = if c.sandwich_norms {
                (
                    Some(vec(&n("post_attention_layernorm.weight"), h)?),
                    vec(&n("pre_feedforward_layernorm.weight"), h)?,
                    Some(vec(&n("post_feedforward_layernorm.weight"), h)?),
                )
            } else {
                (None, vec(&n("post_attention_layernorm.weight"), h)?, None)
            };
            let ple = match c.per_layer_input {
                None => None,
                Some(p) => Some((
                    lin(&n("per_layer_input_gate.weight"), &[p.hidden_size, h])?,
                    lin(&n("per_layer_projection.weight"), &[h, p.hidden_size])?,
                    vec(&n("post_per_layer_input_norm.weight"), h)?,
                )),
            };
            let layer_scalar = if c.layer_scalar {
                w.require(&n("layer_scalar"), &[1])?.to_f32_vec()?[0]
            } else {
                1.0
            };
            let inv: Vec<f32> = lc.rope.inv_freq(d).iter().map(|&x| x as f32).collect();
            layers.push(LayerTensors {
                input_norm: vec(&n("input_layernorm.weight"), h)?,
                post_attn_norm,
                pre_mlp_norm,
                post_mlp_norm,
                q: lin(&n("self_attn.q_proj.weight"), &[nh * d, h])?,
                k: if owns {
                    Some(lin(&n("self_attn.k_proj.weight"), &[nkv * d, h])?)
                } else {
                    None
                },
                v: if owns {
                    Some(lin(&n("self_attn.v_proj.weight"), &[nkv * d, h])?)
                } else {
                    None
                },
                o: lin(&n("self_attn.o_proj.weight"), &[h, nh * d])?,
                q_norm: if c.qk_norm {
                    Some(vec(&n("self_attn.q_norm.weight"), d)?)
                } else {
                    None
                },
                k_norm: if c.qk_norm && owns {
                    Some(vec(&n("self_attn.k_norm.weight"), d)?)
                } else {
                    None
                },
                gate: lin(&n("mlp.gate_proj.weight"), &[f, h])?,
                up: lin(&n("mlp.up_proj.weight"), &[f, h])?,
                down: lin(&n("mlp.down_proj.weight"), &[h, f])?,
                ple,
                layer_scalar,
                inv_freq: b.upload(HostSlice::F32(&inv))?,
            });
            progress(l + 2);
        }
        let lm_head = if tied {
            None
        } else {
            Some(lin("lm_head.weight", &[c.vocab_size, h])?)
        };
        progress(steps);
        Ok(Self {
            embed,
            ple,
            layers,
            final_norm: vec("norm.weight", h)?,
            lm_head,
        })
    }
}

impl<B: Backend> ModelTensors<B> {
    /// The matrices one decode step multiplies through: every matmul matrix, the output
    /// projection included (the token embedding when it is tied).
    fn step_matrices(&self) -> Vec<&Linear<B>> {
        let mut m = vec![self.lm_head.as_ref().unwrap_or(&self.embed)];
        if let Some(p) = &self.ple {
            m.push(&p.projection);
        }
        for l in &self.layers {
            m.extend([&l.q, &l.o, &l.gate, &l.up, &l.down]);
            m.extend(l.k.iter().chain(&l.v));
            if let Some((g, p, _)) = &l.ple {
                m.extend([g, p]);
            }
        }
        m
    }

    /// Every matrix once: the step's (`step_matrices`), then the lookup-only tables.
    pub(crate) fn matrices(&self) -> Vec<&Linear<B>> {
        let mut m = self.step_matrices();
        m.extend(self.lookup_tables());
        m
    }

    /// The tables used for lookups only: the token embedding when it is not the output
    /// projection, and Gemma-4's per-layer embeddings.
    fn lookup_tables(&self) -> Vec<&Linear<B>> {
        let embed = self.lm_head.is_some().then_some(&self.embed);
        embed
            .into_iter()
            .chain(self.ple.as_ref().map(|p| &p.table))
            .collect()
    }

    /// Weight elements one decode step multiplies through (`step_matrices`): the bytes a
    /// step must read are this times the weight dtype's size.
    pub fn matmul_elements(&self) -> usize {
        self.step_matrices()
            .iter()
            .map(|l| l.rows() * l.cols())
            .sum()
    }
}

impl<B: QuantUpload> ModelTensors<B> {
    /// Bytes of the backend's memory the weight matrices take (lookup tables included,
    /// host tables and the small vectors not), and the bytes of those a decode step's
    /// products read (the matrices of [`ModelTensors::matmul_elements`]).
    pub fn weight_bytes(&self) -> (usize, usize) {
        let bytes = |m: Vec<&Linear<B>>| m.iter().map(|l| l.backend_bytes()).sum::<usize>();
        let step = bytes(self.step_matrices());
        (step + bytes(self.lookup_tables()), step)
    }
}
