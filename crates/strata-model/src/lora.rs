//! LoRA adapters in PEFT's format (`adapter_config.json` and `adapter_model.safetensors`):
//! loaded against a model's own matrices, and their products added to the base ones for
//! the rows of the sequences that run with them.
//!
//! An adapter is kept in host memory once loaded; at most `max_resident` are on the backend
//! at once, each in a slot of per-matrix stacks (`A` of every slot back to back, `B` the
//! same; an adapter of a smaller rank padded with zeros, one that skips a matrix all zeros
//! there). A step names each row's slot, and `Backend::lora_bgmv` adds
//! `scale * B (A x)` of that slot to the row (Punica's batched gather matrix-vector
//! product), so one step mixes adapters and rows without one, and every row gets
//! `W x + scale * B (A x)` whatever it is batched with. The slots are data: a decode step
//! captured as a graph replays with other adapters on its rows. Stacks are allocated when
//! an adapter first needs them, and again, larger, when a loaded adapter's rank or dtype
//! does not fit; either bumps [`LoraSet::generation`], which retires captured graphs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use serde_json::Value;
use strata_kernels::{Backend, DType, LoraOut, LoraShape, LoraStacks, StridedCopy};
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

/// `A` and `B` of a matrix as they are read (either may be missing until both are).
type HalfPair = (Option<HostMatrix>, Option<HostMatrix>);

/// One adapted matrix of every slot on the backend: `A` as `[slots, rank, cols]` and `B`
/// as `[slots, out, rank]`.
struct Stack<B: Backend> {
    a: B::Buffer,
    b: B::Buffer,
    cols: usize,
    out: usize,
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

    /// The dtype its matrices keep in a stack: bf16 when every one is stored so, else f32
    /// (which holds f16 and f32 values exactly).
    fn stack_dtype(&self) -> DType {
        let all_bf16 = self
            .pairs
            .values()
            .all(|(a, b)| a.dtype == DType::BF16 && b.dtype == DType::BF16);
        match all_bf16 {
            true => DType::BF16,
            false => DType::F32,
        }
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

/// Slots a set has when nobody says otherwise (the engine sets `--max-loras`).
const DEFAULT_SLOTS: usize = 8;

struct SetState<B: Backend> {
    loaded: HashMap<u32, Arc<LoraAdapter>>,
    /// Resident ids, least recently used first.
    lru: Vec<u32>,
    max_resident: usize,
    uploads: u64,
    /// The adapter in each slot of the stacks (empty until a step first needs them).
    slots: Vec<Option<u32>>,
    stacks: HashMap<(usize, Target), Stack<B>>,
    /// `[slots]` f32: each slot's scale.
    scales: Option<B::Buffer>,
    rank: usize,
    dtype: DType,
    generation: u64,
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
                lru: Vec::new(),
                max_resident: DEFAULT_SLOTS,
                uploads: 0,
                slots: Vec::new(),
                stacks: HashMap::new(),
                scales: None,
                rank: 0,
                dtype: DType::BF16,
                generation: 0,
            }),
        }
    }
}

impl<B: Backend> LoraSet<B> {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SetState<B>> {
        self.state.write().expect("adapter set lock")
    }

    fn read(&self) -> RwLockReadGuard<'_, SetState<B>> {
        self.state.read().expect("adapter set lock")
    }

    /// Adds (or replaces) adapter `id`; id 0 means "no adapter" and is refused.
    pub fn insert(&self, id: u32, adapter: LoraAdapter) -> Result<()> {
        if id == 0 {
            return Err(bad("id 0 stands for no adapter".into()));
        }
        let mut st = self.write();
        st.loaded.insert(id, Arc::new(adapter));
        st.evict(id);
        Ok(())
    }

    /// Drops adapter `id`; whether it was loaded.
    pub fn remove(&self, id: u32) -> bool {
        let mut st = self.write();
        st.evict(id);
        st.loaded.remove(&id).is_some()
    }

    /// At most `n` adapters on the backend at once (at least 1); a step may name no more.
    /// The stacks are made again, at `n` slots, when a step next needs them.
    pub fn set_max_resident(&self, n: usize) {
        let mut st = self.write();
        st.max_resident = n.max(1);
        st.reset();
    }

    /// How the set stands.
    pub fn stats(&self) -> LoraStats {
        let st = self.read();
        LoraStats {
            loaded: st.loaded.len(),
            resident: st.slots.iter().flatten().count(),
            uploads: st.uploads,
        }
    }

    /// Changes whenever the stacks are made again or one is added: a graph captured at
    /// another generation reads stale buffers and must be captured again.
    pub(crate) fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Moves every adapter of `from` into this set (a model taking another's place); they
    /// reach this model's stacks when a step names them.
    pub(crate) fn adopt(&self, from: &LoraSet<B>) {
        let mut theirs = from.write();
        let mut ours = self.write();
        ours.loaded.extend(std::mem::take(&mut theirs.loaded));
        ours.max_resident = theirs.max_resident;
        ours.generation = ours.generation.max(theirs.generation) + 1;
        theirs.reset();
    }

    /// Each row's slot for `batch`, whose sequence `i` owns its `tokens.len()` consecutive
    /// rows (`u32::MAX`: no adapter), with the step's adapters put in the stacks first
    /// where they are not (the least recently used others giving up their slots). `None`
    /// when no sequence has an adapter; refused when the step names more adapters than
    /// there are slots.
    pub(crate) fn slots_for(&self, b: &B, batch: &ForwardBatch) -> Result<Option<Vec<u32>>> {
        if !batch.has_adapters() {
            return Ok(None);
        }
        let mut step: Vec<u32> = Vec::new();
        for i in 0..batch.seqs.len() {
            let id = batch.adapter(i);
            if id != 0 && !step.contains(&id) {
                step.push(id);
            }
        }
        let mut st = self.write();
        if step.len() > st.max_resident {
            return Err(ModelError::Invalid(format!(
                "a step names {} LoRA adapters; at most {} fit on the backend at once",
                step.len(),
                st.max_resident
            )));
        }
        st.fit(b)?;
        for &id in &step {
            st.make_resident(b, id, &step)?;
        }
        let mut rows = Vec::new();
        for (i, s) in batch.seqs.iter().enumerate() {
            let slot = match batch.adapter(i) {
                0 => u32::MAX,
                id => st.slot_of(id).map_or(u32::MAX, |s| s as u32),
            };
            rows.extend(std::iter::repeat_n(slot, s.tokens.len()));
        }
        Ok(Some(rows))
    }

    /// The step's products over the stacks, each row's slot in `slots` (`None`: no row
    /// has an adapter). Holds the set for reading until dropped.
    pub(crate) fn runs<'a>(&'a self, slots: Option<Slots<'a, B>>) -> AdapterRuns<'a, B> {
        AdapterRuns(slots.map(|s| (self.read(), s)))
    }
}

impl<B: Backend> SetState<B> {
    fn slot_of(&self, id: u32) -> Option<usize> {
        self.slots.iter().position(|&s| s == Some(id))
    }

    /// Takes `id` off the backend: its slot is free (no row names it any more).
    fn evict(&mut self, id: u32) {
        if let Some(at) = self.slot_of(id) {
            self.slots[at] = None;
        }
        self.lru.retain(|&r| r != id);
    }

    /// Drops the stacks; the next step makes them again.
    fn reset(&mut self) {
        self.slots.clear();
        self.stacks.clear();
        self.scales = None;
        self.lru.clear();
        self.rank = 0;
        self.generation += 1;
    }

    /// Makes the stacks again when there are none, or when a loaded adapter's rank or
    /// dtype does not fit them: at `max_resident` slots, the largest loaded rank, and f32
    /// when some adapter is not bf16.
    fn fit(&mut self, b: &B) -> Result<()> {
        let rank = self.loaded.values().map(|a| a.info.rank).max().unwrap_or(1);
        let f32 = self.loaded.values().any(|a| a.stack_dtype() == DType::F32);
        let dtype = match f32 || self.dtype == DType::F32 && !self.slots.is_empty() {
            true => DType::F32,
            false => DType::BF16,
        };
        let fits = self.slots.len() == self.max_resident
            && rank <= self.rank
            && (dtype == self.dtype || self.dtype == DType::F32);
        if fits {
            return Ok(());
        }
        self.reset();
        self.slots = vec![None; self.max_resident];
        self.scales = Some(b.zeros(self.max_resident, DType::F32)?);
        self.rank = rank;
        self.dtype = dtype;
        Ok(())
    }

    /// Puts adapter `id` in a slot unless it has one: a free slot, or the least recently
    /// used adapter's that `step` does not name.
    fn make_resident(&mut self, b: &B, id: u32, step: &[u32]) -> Result<()> {
        if self.slot_of(id).is_none() {
            let ad =
                self.loaded.get(&id).cloned().ok_or_else(|| {
                    ModelError::Invalid(format!("LoRA adapter {id} is not loaded"))
                })?;
            let slot = match self.slots.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    let at = self.lru.iter().position(|r| !step.contains(r));
                    let oldest = at.map(|at| self.lru[at]).ok_or_else(|| {
                        ModelError::Invalid("no LoRA slot is free for the step".into())
                    })?;
                    let slot = self.slot_of(oldest).expect("a resident adapter has a slot");
                    self.evict(oldest);
                    slot
                }
            };
            self.write_slot(b, slot, &ad)?;
            self.slots[slot] = Some(id);
            self.uploads += 1;
        }
        self.lru.retain(|&r| r != id);
        self.lru.push(id);
        Ok(())
    }

    /// Writes `ad` into `slot` of every stack (zeros where it adapts nothing, and past its
    /// rank), a stack made first for each matrix it adapts that has none, and its scale.
    fn write_slot(&mut self, b: &B, slot: usize, ad: &LoraAdapter) -> Result<()> {
        let (rank, dtype, slots) = (self.rank, self.dtype, self.slots.len());
        for (&key, (a, bm)) in &ad.pairs {
            if let std::collections::hash_map::Entry::Vacant(e) = self.stacks.entry(key) {
                let (cols, out) = (a.cols, bm.rows);
                e.insert(Stack {
                    a: b.zeros(slots * rank * cols, dtype)?,
                    b: b.zeros(slots * out * rank, dtype)?,
                    cols,
                    out,
                });
                self.generation += 1;
            }
        }
        for (key, st) in self.stacks.iter_mut() {
            let (a_len, b_len) = (rank * st.cols, st.out * rank);
            let zeros = b.zeros(a_len.max(b_len), dtype)?;
            b.copy_strided(&zeros, &mut st.a, rows_copy(1, a_len, 0, slot))?;
            b.copy_strided(&zeros, &mut st.b, rows_copy(1, b_len, 0, slot))?;
            let Some((am, bm)) = ad.pairs.get(key) else {
                continue;
            };
            // `A [r, cols]` fills the slot's first r rows.
            let av = b.upload_f32_as(&am.values, dtype)?;
            b.copy_strided(&av, &mut st.a, at(am.values.len(), slot * a_len))?;
            let bv = b.upload_f32_as(&bm.values, dtype)?;
            // `B [out, r]` into `[out, rank]`: row by row, the rank's tail left zero.
            let c = StridedCopy {
                rows: st.out,
                cols: bm.cols,
                src_offset: 0,
                src_stride: bm.cols,
                dst_offset: slot * b_len,
                dst_stride: rank,
            };
            b.copy_strided(&bv, &mut st.b, c)?;
        }
        let scale = b.upload_f32_as(&[ad.info.scale()], DType::F32)?;
        let scales = self.scales.as_mut().expect("made with the slots");
        b.copy_strided(&scale, scales, at(1, slot))?;
        Ok(())
    }
}

/// A step's row slots on the backend: uploaded for the step, or a captured graph's input.
pub(crate) enum Slots<'a, B: Backend> {
    /// Uploaded for this step.
    Owned(B::Index),
    /// A graph's input buffer.
    Borrowed(&'a B::Index),
}

impl<B: Backend> Slots<'_, B> {
    fn index(&self) -> &B::Index {
        match self {
            Slots::Owned(i) => i,
            Slots::Borrowed(i) => i,
        }
    }
}

/// A step's LoRA products ([`LoraSet::runs`]).
pub(crate) struct AdapterRuns<'a, B: Backend>(
    Option<(RwLockReadGuard<'a, SetState<B>>, Slots<'a, B>)>,
);

impl<B: Backend> AdapterRuns<'_, B> {
    /// No adapter (a step of the drafter, which serves none, or of a batch without one).
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// Whether the step adds products to `target` of layer `l`: some adapter on the
    /// backend adapts it (the rows of the others add zeros).
    pub(crate) fn touches(&self, l: usize, target: Target) -> bool {
        self.0
            .as_ref()
            .is_some_and(|(st, _)| st.stacks.contains_key(&(l, target)))
    }

    /// Adds `scale * B (A x)` of each row's adapter that adapts `target` of layer `l` to
    /// the row of `out [t, out_features]`; `x` is `[t, in_features]`.
    pub(crate) fn add(
        &self,
        b: &B,
        l: usize,
        target: Target,
        x: &B::Buffer,
        t: usize,
        out: &mut B::Buffer,
    ) -> Result<()> {
        let Some((st, slots)) = &self.0 else {
            return Ok(());
        };
        let Some(stack) = st.stacks.get(&(l, target)) else {
            return Ok(());
        };
        let scales = st.scales.as_ref().expect("made with the stacks");
        let shape = LoraShape {
            rows: t,
            slots: st.slots.len(),
            rank: st.rank,
            cols: stack.cols,
            out: stack.out,
        };
        let stacks = LoraStacks {
            a: &stack.a,
            b: &stack.b,
            scales,
        };
        Ok(b.lora_bgmv(x, stacks, slots.index(), shape, out)?)
    }

    /// [`Self::add`] for targets of layer `l` that read the same `x` (q, k and v; gate and
    /// up), each adding to its own output, as one [`Backend::lora_bgmv_shared_input`].
    pub(crate) fn add_shared(
        &self,
        b: &B,
        l: usize,
        x: &B::Buffer,
        t: usize,
        outs: &mut [(Target, &mut B::Buffer)],
    ) -> Result<()> {
        let Some((st, slots)) = &self.0 else {
            return Ok(());
        };
        let scales = st.scales.as_ref().expect("made with the stacks");
        let mut cols = 0;
        let mut parts: Vec<LoraOut<'_, B::Buffer>> = Vec::with_capacity(outs.len());
        for (target, out) in outs.iter_mut() {
            let Some(stack) = st.stacks.get(&(l, *target)) else {
                continue;
            };
            cols = stack.cols;
            parts.push(LoraOut {
                stacks: LoraStacks {
                    a: &stack.a,
                    b: &stack.b,
                    scales,
                },
                out_features: stack.out,
                out: &mut **out,
            });
        }
        if parts.is_empty() {
            return Ok(());
        }
        let shape = LoraShape {
            rows: t,
            slots: st.slots.len(),
            rank: st.rank,
            cols,
            out: 0,
        };
        Ok(b.lora_bgmv_shared_input(x, &mut parts, slots.index(), shape)?)
    }
}

/// The first `len` values of the source to `dst_offset`.
fn at(len: usize, dst_offset: usize) -> StridedCopy {
    StridedCopy {
        rows: 1,
        cols: len,
        src_offset: 0,
        src_stride: len,
        dst_offset,
        dst_stride: len,
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
