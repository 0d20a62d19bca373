//! LoRA adapters in PEFT's format (`adapter_config.json` and `adapter_model.safetensors`):
//! loaded against a model's own matrices, and their products added to the base ones for
//! the rows of the sequences that run with them. One step may mix adapters: the rows of
//! each adapter are gathered, multiplied by its `A` then `B`, scaled and added back, so
//! every sequence gets exactly `W x + scale * B (A x)` whatever it is batched with.
//!
//! An adapter is kept in host memory once loaded; at most `max_resident` are on the backend
//! at once (uploaded when a step names them, the least recently used one dropped to make
//! room), so many adapters can be served from little device memory.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use strata_kernels::{Backend, DType, StridedCopy};
use strata_weights::{SafetensorsModel, WeightSource};

use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::tensors::LayerTensors;
use crate::ForwardBatch;

/// The matrices of a layer an adapter may target, by PEFT's module names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj` (only on layers that own their K/V).
    K,
    /// `self_attn.v_proj` (only on layers that own their K/V).
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl Target {
    const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// PEFT's module name.
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    fn from_module(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.module() == name)
    }

    /// The base matrix of layer `lw` this target adds to (`None`: the layer has none).
    fn base<B: Backend>(self, lw: &LayerTensors<B>) -> Option<&Linear<B>> {
        match self {
            Target::Q => Some(&lw.q),
            Target::K => lw.k.as_ref(),
            Target::V => lw.v.as_ref(),
            Target::O => Some(&lw.o),
            Target::Gate => Some(&lw.gate),
            Target::Up => Some(&lw.up),
            Target::Down => Some(&lw.down),
        }
    }
}

/// A matrix in host memory: its values, `[rows, cols]`, and the dtype it was stored in
/// (what it is uploaded as).
struct HostMatrix {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    dtype: DType,
}

impl HostMatrix {
    fn upload<B: Backend>(&self, b: &B) -> Result<Linear<B>> {
        Ok(Linear::Dense {
            w: b.upload_f32_as(&self.values, self.dtype)?,
            rows: self.rows,
            cols: self.cols,
        })
    }
}

/// `A` and `B` of a matrix as they are read (either may be missing until both are).
type HalfPair = (Option<HostMatrix>, Option<HostMatrix>);

/// A step's adapter: its id, its matrices on the backend, and the runs of rows
/// (`(first row, rows)`) it serves.
type Group<B> = (u32, Arc<Uploaded<B>>, Vec<(usize, usize)>);

/// One adapted matrix on the backend: `A [rank, in]` and `B [out, rank]`.
struct Pair<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

/// An adapter's matrices on the backend, and its scale.
pub(crate) struct Uploaded<B: Backend> {
    scale: f32,
    pairs: HashMap<(usize, Target), Pair<B>>,
}

/// What an adapter's `adapter_config.json` says, as Strata takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraInfo {
    /// The rank `r`.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// Whether the scale is `alpha / sqrt(r)` (rsLoRA) rather than `alpha / r`.
    pub rslora: bool,
    /// The modules it adapts, in layer order (`(layer, module)`).
    pub adapted: Vec<(usize, &'static str)>,
}

impl LoraInfo {
    /// The factor the adapter's product is multiplied by.
    pub fn scale(&self) -> f32 {
        let r = self.rank as f64;
        let d = if self.rslora { r.sqrt() } else { r };
        (self.alpha / d) as f32
    }
}

/// A loaded adapter: its matrices per layer and target, in host memory.
pub struct LoraAdapter {
    info: LoraInfo,
    pairs: HashMap<(usize, Target), (HostMatrix, HostMatrix)>,
}

impl LoraAdapter {
    /// What the adapter is.
    pub fn info(&self) -> &LoraInfo {
        &self.info
    }

    /// Its matrices on `b`.
    fn upload<B: Backend>(&self, b: &B) -> Result<Uploaded<B>> {
        let mut pairs = HashMap::with_capacity(self.pairs.len());
        for (&key, (a, bm)) in &self.pairs {
            pairs.insert(
                key,
                Pair {
                    a: a.upload(b)?,
                    b: bm.upload(b)?,
                },
            );
        }
        Ok(Uploaded {
            scale: self.info.scale(),
            pairs,
        })
    }
}

impl LoraAdapter {
    /// Loads the PEFT adapter in `dir` for a model of `layers` on backend `b`, refusing
    /// (with the field, module or layer named) what Strata cannot serve exactly: another
    /// method than LoRA, DoRA, biases, `modules_to_save`, per-module ranks or alphas, a
    /// rank above `max_rank`, a module the layer lacks (a KV-shared layer's k or v), or
    /// shapes that are not the model's (an adapter for another model).
    pub fn load<B: Backend>(
        layers: &[LayerTensors<B>],
        dir: &Path,
        max_rank: usize,
    ) -> Result<Self> {
        let config_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
        let cfg: Value = serde_json::from_str(&text)
            .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
        let (rank, alpha, rslora) = read_config(&cfg)?;
        if rank == 0 || rank > max_rank {
            return Err(bad(format!(
                "the adapter's rank {rank} is outside 1..={max_rank} (--max-lora-rank)"
            )));
        }
        let weights = SafetensorsModel::open(dir.join("adapter_model.safetensors"))?;
        let mut pairs: HashMap<(usize, Target), HalfPair> = HashMap::new();
        let mut names = weights.names();
        names.sort_unstable();
        let parsed = names
            .iter()
            .map(|n| parse_name(n).map(|p| (*n, p)))
            .collect::<Result<Vec<_>>>()?;
        // The layer count first: it says "another model" more plainly than a shape.
        if let Some((name, (l, ..))) = parsed.iter().find(|(_, p)| p.0 >= layers.len()) {
            return Err(bad(format!(
                "`{name}`: layer {l}, but the model has {} layers (an adapter for another model?)",
                layers.len()
            )));
        }
        for (name, (l, target, is_a)) in parsed {
            let lw = &layers[l];
            let base = target.base(lw).ok_or_else(|| {
                bad(format!(
                    "`{name}`: layer {l} has no {} (it reads another layer's K/V)",
                    target.module()
                ))
            })?;
            let view = weights
                .get(name)
                .ok_or_else(|| bad(format!("`{name}` is unreadable")))?;
            let want = match is_a {
                true => (rank, base.cols()),
                false => (base.rows(), rank),
            };
            if (view.rows(), view.row_len()) != want || view.shape.len() != 2 {
                return Err(bad(format!(
                    "`{name}` has shape {:?}; layer {l}'s {} wants {want:?} (an adapter for \
                     another model, or a rank other than {rank}?)",
                    view.shape,
                    target.module()
                )));
            }
            let dtype = match view.ty {
                strata_weights::GgmlType::F32 => DType::F32,
                strata_weights::GgmlType::BF16 => DType::BF16,
                strata_weights::GgmlType::F16 => DType::F16,
                other => return Err(bad(format!("`{name}` is stored as {other:?}"))),
            };
            let lin = HostMatrix {
                values: view.to_f32_vec()?,
                rows: want.0,
                cols: want.1,
                dtype,
            };
            let slot = pairs.entry((l, target)).or_default();
            match is_a {
                true => slot.0 = Some(lin),
                false => slot.1 = Some(lin),
            }
        }
        let mut done = HashMap::new();
        let mut adapted = Vec::new();
        for ((l, target), pair) in pairs {
            let (Some(a), Some(bm)) = pair else {
                return Err(bad(format!(
                    "layer {l}'s {} has only one of lora_A and lora_B",
                    target.module()
                )));
            };
            adapted.push((l, target.module()));
            done.insert((l, target), (a, bm));
        }
        if done.is_empty() {
            return Err(bad("the adapter holds no LoRA matrix".into()));
        }
        adapted.sort_unstable();
        let info = LoraInfo {
            rank,
            alpha,
            rslora,
            adapted,
        };
        Ok(Self { info, pairs: done })
    }
}

fn bad(msg: String) -> ModelError {
    ModelError::Invalid(format!("LoRA adapter: {msg}"))
}

/// `(rank, alpha, rslora)` from `adapter_config.json`, refusing the options that would
/// change the output in ways Strata does not compute.
fn read_config(cfg: &Value) -> Result<(usize, f64, bool)> {
    let field = |k: &str| cfg.get(k).filter(|v| !v.is_null());
    match field("peft_type").and_then(Value::as_str) {
        Some("LORA") | None => {}
        Some(other) => return Err(bad(format!("`peft_type` {other} is not LoRA"))),
    }
    let refuse_true = ["use_dora", "fan_in_fan_out", "use_qalora", "lora_bias"];
    for k in refuse_true {
        if field(k).and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("`{k}` is not supported")));
        }
    }
    if let Some(v) = field("bias")
        .and_then(Value::as_str)
        .filter(|&v| v != "none")
    {
        return Err(bad(format!("`bias` {v} is not supported (only \"none\")")));
    }
    let nonempty = |v: &Value| match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    for k in [
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "trainable_token_indices",
    ] {
        if field(k).is_some_and(nonempty) {
            return Err(bad(format!("`{k}` is not supported")));
        }
    }
    let rank = field("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("`r` is missing or not a whole number".into()))? as usize;
    let alpha = field("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("`lora_alpha` is missing or not a number".into()))?;
    let rslora = field("use_rslora").and_then(Value::as_bool) == Some(true);
    Ok((rank, alpha, rslora))
}

/// `(layer, target, is_a)` of a PEFT tensor name such as
/// `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`.
fn parse_name(name: &str) -> Result<(usize, Target, bool)> {
    let unsupported = || {
        bad(format!(
            "`{name}` is not a LoRA matrix of a layer's q/k/v/o/gate/up/down"
        ))
    };
    let parts: Vec<&str> = name.split('.').collect();
    let n = parts.len();
    if n < 5 || parts[n - 1] != "weight" {
        return Err(unsupported());
    }
    let is_a = match parts[n - 2] {
        "lora_A" => true,
        "lora_B" => false,
        _ => return Err(unsupported()),
    };
    let target = Target::from_module(parts[n - 3]).ok_or_else(unsupported)?;
    let at = parts
        .iter()
        .rposition(|&p| p == "layers")
        .ok_or_else(unsupported)?;
    let l = parts
        .get(at + 1)
        .and_then(|p| p.parse::<usize>().ok())
        .ok_or_else(unsupported)?;
    Ok((l, target, is_a))
}

/// The adapters a model has loaded, by the id a batch names them with (1 and up), and those
/// on the backend now.
pub struct LoraSet<B: Backend> {
    state: RwLock<SetState<B>>,
}

struct SetState<B: Backend> {
    loaded: HashMap<u32, Arc<LoraAdapter>>,
    resident: HashMap<u32, Arc<Uploaded<B>>>,
    /// Resident ids, least recently used first.
    lru: Vec<u32>,
    max_resident: usize,
    uploads: u64,
}

/// How the adapter set stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoraStats {
    /// Adapters loaded (in host memory).
    pub loaded: usize,
    /// Adapters on the backend now.
    pub resident: usize,
    /// Uploads to the backend since the start (the first use of each adapter, and every
    /// use after it was dropped to make room).
    pub uploads: u64,
}

impl<B: Backend> Default for LoraSet<B> {
    fn default() -> Self {
        Self {
            state: RwLock::new(SetState {
                loaded: HashMap::new(),
                resident: HashMap::new(),
                lru: Vec::new(),
                max_resident: usize::MAX,
                uploads: 0,
            }),
        }
    }
}

impl<B: Backend> LoraSet<B> {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SetState<B>> {
        self.state.write().expect("adapter set lock")
    }

    /// Adds (or replaces) adapter `id`; id 0 means "no adapter" and is refused.
    pub fn insert(&self, id: u32, adapter: LoraAdapter) -> Result<()> {
        if id == 0 {
            return Err(bad("id 0 stands for no adapter".into()));
        }
        let mut st = self.write();
        st.loaded.insert(id, Arc::new(adapter));
        st.resident.remove(&id);
        st.lru.retain(|&r| r != id);
        Ok(())
    }

    /// Drops adapter `id`; whether it was loaded.
    pub fn remove(&self, id: u32) -> bool {
        let mut st = self.write();
        st.resident.remove(&id);
        st.lru.retain(|&r| r != id);
        st.loaded.remove(&id).is_some()
    }

    /// At most `n` adapters on the backend at once (at least 1); a step may name no more.
    pub fn set_max_resident(&self, n: usize) {
        let mut st = self.write();
        st.max_resident = n.max(1);
        while st.resident.len() > st.max_resident {
            let oldest = st.lru.remove(0);
            st.resident.remove(&oldest);
        }
    }

    /// How the set stands.
    pub fn stats(&self) -> LoraStats {
        let st = self.state.read().expect("adapter set lock");
        LoraStats {
            loaded: st.loaded.len(),
            resident: st.resident.len(),
            uploads: st.uploads,
        }
    }

    /// Moves every adapter of `from` into this set (a model taking another's place).
    pub(crate) fn adopt(&self, from: &LoraSet<B>) {
        let mut theirs = from.write();
        let mut ours = self.write();
        ours.loaded.extend(std::mem::take(&mut theirs.loaded));
        ours.resident.extend(std::mem::take(&mut theirs.resident));
        let lru = std::mem::take(&mut theirs.lru);
        ours.lru.extend(lru);
    }

    /// The step's adapters on the backend `b` (uploaded there first where they are not,
    /// the least recently used others dropped to make room) and the runs of rows
    /// (`(first row, rows)`) each serves, from a batch whose sequence `i` owns its
    /// `tokens.len()` consecutive rows. Empty when no sequence has an adapter; refused when
    /// the step names more adapters than may be on the backend at once.
    pub(crate) fn runs(&self, b: &B, batch: &ForwardBatch) -> Result<AdapterRuns<B>> {
        let mut runs: Vec<(u32, Vec<(usize, usize)>)> = Vec::new();
        if !batch.has_adapters() {
            return Ok(AdapterRuns::none());
        }
        let mut row = 0;
        for (i, s) in batch.seqs.iter().enumerate() {
            let id = batch.adapter(i);
            let n = s.tokens.len();
            if id != 0 {
                match runs.iter_mut().find(|g| g.0 == id) {
                    Some(g) => g.1.push((row, n)),
                    None => runs.push((id, vec![(row, n)])),
                }
            }
            row += n;
        }
        let mut st = self.write();
        if runs.len() > st.max_resident {
            return Err(ModelError::Invalid(format!(
                "a step names {} LoRA adapters; at most {} fit on the backend at once",
                runs.len(),
                st.max_resident
            )));
        }
        let step: Vec<u32> = runs.iter().map(|r| r.0).collect();
        let mut groups = Vec::with_capacity(runs.len());
        for (id, rows) in runs {
            let up = match st.resident.get(&id) {
                Some(up) => up.clone(),
                None => {
                    let ad = st.loaded.get(&id).cloned().ok_or_else(|| {
                        ModelError::Invalid(format!("LoRA adapter {id} is not loaded"))
                    })?;
                    // Room first: the least recently used adapter this step does not name goes.
                    while st.resident.len() >= st.max_resident {
                        let Some(at) = st.lru.iter().position(|r| !step.contains(r)) else {
                            break;
                        };
                        let oldest = st.lru.remove(at);
                        st.resident.remove(&oldest);
                    }
                    let up = Arc::new(ad.upload(b)?);
                    st.resident.insert(id, up.clone());
                    st.uploads += 1;
                    up
                }
            };
            st.lru.retain(|&r| r != id);
            st.lru.push(id);
            groups.push((id, up, rows));
        }
        Ok(AdapterRuns(groups))
    }
}

/// A step's adapters with the rows each serves (`LoraSet::runs`).
pub(crate) struct AdapterRuns<B: Backend>(Vec<Group<B>>);

impl<B: Backend> AdapterRuns<B> {
    /// No adapter (a step of the drafter, which serves none).
    pub(crate) fn none() -> Self {
        Self(Vec::new())
    }

    /// Whether some adapter of the step adapts `target` of layer `l`.
    pub(crate) fn touches(&self, l: usize, target: Target) -> bool {
        self.0
            .iter()
            .any(|(_, a, _)| a.pairs.contains_key(&(l, target)))
    }

    /// Adds `scale * B (A x)` of each adapter of the step that adapts `target` of layer
    /// `l` to the rows of `out [t, out_features]` it serves; `x` is `[t, in_features]`.
    pub(crate) fn add(
        &self,
        b: &B,
        l: usize,
        target: Target,
        x: &B::Buffer,
        t: usize,
        out: &mut B::Buffer,
    ) -> Result<()> {
        for (_, ad, runs) in &self.0 {
            let Some(pair) = ad.pairs.get(&(l, target)) else {
                continue;
            };
            let (cols, rows, rank) = (pair.a.cols(), pair.b.rows(), pair.a.rows());
            let n: usize = runs.iter().map(|r| r.1).sum();
            let dtype = b.activation_dtype();
            let whole = runs.len() == 1 && runs[0] == (0, t);
            let gathered;
            let xs = match whole {
                true => x,
                false => {
                    let mut g = b.scratch(n * cols, dtype)?;
                    let mut at = 0;
                    for &(from, len) in runs {
                        b.copy_strided(x, &mut g, rows_copy(len, cols, from, at))?;
                        at += len;
                    }
                    gathered = g;
                    &gathered
                }
            };
            let mut h = b.scratch(n * rank, dtype)?;
            pair.a.forward(b, xs, &mut h)?;
            let mut d = b.scratch(n * rows, dtype)?;
            pair.b.forward(b, &h, &mut d)?;
            b.scale(&mut d, ad.scale)?;
            if whole {
                b.add(out, &d)?;
                continue;
            }
            // Scattered back into a zero step-sized buffer, then added: the rows of other
            // sequences get zeros.
            let mut full = b.zeros(t * rows, dtype)?;
            let mut at = 0;
            for &(to, len) in runs {
                b.copy_strided(&d, &mut full, rows_copy(len, rows, at, to))?;
                at += len;
            }
            b.add(out, &full)?;
        }
        Ok(())
    }
}

/// A copy of `rows` whole rows of `cols` values from row `from` to row `to`.
fn rows_copy(rows: usize, cols: usize, from: usize, to: usize) -> StridedCopy {
    StridedCopy {
        rows,
        cols,
        src_offset: from * cols,
        src_stride: cols,
        dst_offset: to * cols,
        dst_stride: cols,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_names_give_layer_module_and_side() {
        let n = "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight";
        assert_eq!(parse_name(n).unwrap(), (3, Target::Q, true));
        let n = "base_model.model.model.language_model.layers.11.mlp.down_proj.lora_B.weight";
        assert_eq!(parse_name(n).unwrap(), (11, Target::Down, false));
        for n in [
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
        ] {
            let e = parse_name(n).unwrap_err().to_string();
            assert!(e.contains(n), "{e}");
        }
    }

    #[test]
    fn configs_that_change_the_output_otherwise_are_refused_by_name() {
        let ok = serde_json::json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                    "bias": "none", "modules_to_save": null});
        assert_eq!(read_config(&ok).unwrap(), (8, 16.0, false));
        for (k, v) in [
            ("use_dora", serde_json::json!(true)),
            ("bias", serde_json::json!("all")),
            ("modules_to_save", serde_json::json!(["lm_head"])),
            ("rank_pattern", serde_json::json!({"q_proj": 4})),
            ("peft_type", serde_json::json!("IA3")),
        ] {
            let mut c = ok.clone();
            c[k] = v;
            let e = read_config(&c).unwrap_err().to_string();
            assert!(e.contains(k) || e.contains("IA3"), "{k}: {e}");
        }
        let info = LoraInfo {
            rank: 16,
            alpha: 32.0,
            rslora: true,
            adapted: Vec::new(),
        };
        assert_eq!(info.scale(), 8.0);
    }
}
