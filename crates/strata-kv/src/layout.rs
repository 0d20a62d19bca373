//! Layout and pricing: which slabs exist, which slab each layer reads, and what a token costs.
//! Pure functions of the model configuration and the KV format; nothing is allocated.

use std::fmt;

use serde::Serialize;
use strata_config::{AttentionType, KvShape, ModelConfig};

use crate::{KvCacheDtype, KvError, KvFormat, ModelDtype};

/// The two page pools: full attention keeps every position, the window pool only the last
/// `window` positions of each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Full attention: every position of a request.
    Full,
    /// Sliding attention: the last `window` positions of a request.
    Window,
}

impl PoolKind {
    /// The pool that layers of this attention type use.
    pub fn of(attention: AttentionType) -> PoolKind {
        match attention {
            AttentionType::Full => PoolKind::Full,
            AttentionType::Sliding => PoolKind::Window,
        }
    }

    /// Lowercase name (`"full"`, `"window"`), as displayed.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Full => "full",
            PoolKind::Window => "window",
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Index of one slab (one KV-owning layer's buffers) in [`KvLayout::slabs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SlabId(pub usize);

/// One KV-owning layer's buffers: K and V values, and for 8-bit formats their scales.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlabLayout {
    /// Index of this slab in [`KvLayout::slabs`].
    pub id: SlabId,
    /// The pool whose slots index this slab.
    pub pool: PoolKind,
    /// The layer that owns (writes) this slab.
    pub layer: usize,
    /// KV heads of the owning layer.
    pub num_kv_heads: usize,
    /// Width of one head's key (and value) vector, in elements.
    pub head_dim: usize,
    /// How the elements are stored.
    pub format: KvFormat,
}

impl SlabLayout {
    /// Bytes of K (or of V) values for one token: all heads.
    pub fn value_bytes_per_token(&self) -> usize {
        self.num_kv_heads * self.head_dim * self.format.element_bytes()
    }

    /// Scales per token for K (or for V): one per KV head, zero without scales.
    pub fn scales_per_token(&self) -> usize {
        if self.format.has_scales() {
            self.num_kv_heads
        } else {
            0
        }
    }

    /// Bytes this layer stores per token: K and V values plus their scales.
    pub fn bytes_per_token(&self) -> usize {
        slab_bytes_per_token(
            KvShape {
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            },
            self.format,
        )
    }
}

/// `2 * heads * head_dim * element_bytes + 2 * heads * scale_bytes`: K and V, values then scales.
pub fn slab_bytes_per_token(shape: KvShape, format: KvFormat) -> usize {
    2 * shape.num_kv_heads * (shape.head_dim * format.element_bytes() + format.scale_bytes())
}

/// One attention group's share of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvGroupLayout {
    /// The pool the group's layers use.
    pub pool: PoolKind,
    /// The group's attention type.
    pub attention: AttentionType,
    /// The sliding window in tokens; `None` for full attention.
    pub window: Option<usize>,
    /// Layers that own KV, ascending; one slab each.
    pub owner_layers: Vec<usize>,
    /// Layers that read an owner's slab.
    pub shared_layers: Vec<usize>,
    /// Slabs of `owner_layers`, same order.
    pub slabs: Vec<SlabId>,
    /// Bytes one token costs across this group's owning layers.
    pub unit_bytes: usize,
    /// What one token would cost if every layer of the group kept its own copy (never
    /// allocated; for comparison only).
    pub unit_bytes_unshared: usize,
}

/// Where one layer's K/V lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayerKv {
    /// The pool whose slots index the slab.
    pub pool: PoolKind,
    /// The slab the layer reads: its own, or its source's for a KV-shared layer.
    pub slab: SlabId,
    /// The layer that writes that slab (the layer itself unless shared).
    pub source_layer: usize,
    /// KV-shared layers compute no K/V; writes for them are no-ops.
    pub shared: bool,
}

/// The pool's layout for one model and KV format.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvLayout {
    format: KvFormat,
    groups: Vec<KvGroupLayout>,
    slabs: Vec<SlabLayout>,
    layers_mapping: Vec<LayerKv>,
}

impl KvLayout {
    /// Lays out one slab per KV-owning layer from `cfg.kv_group_specs()`; shared layers map
    /// to their source's slab.
    pub fn new(
        cfg: &ModelConfig,
        dtype: KvCacheDtype,
        model_dtype: ModelDtype,
    ) -> Result<KvLayout, KvError> {
        let format = dtype.resolve(model_dtype);
        let mut groups = Vec::new();
        let mut slabs = Vec::new();
        for spec in cfg.kv_group_specs() {
            let pool = PoolKind::of(spec.attention);
            if spec.layer_ids.len() != spec.kv_shapes.len() {
                return Err(KvError::invalid(
                    "kv group",
                    "owning layers and their shapes differ in length",
                ));
            }
            let mut ids = Vec::new();
            for (&layer, shape) in spec.layer_ids.iter().zip(&spec.kv_shapes) {
                let id = SlabId(slabs.len());
                ids.push(id);
                slabs.push(SlabLayout {
                    id,
                    pool,
                    layer,
                    num_kv_heads: shape.num_kv_heads,
                    head_dim: shape.head_dim,
                    format,
                });
            }
            let unit_bytes = ids.iter().map(|s| slabs[s.0].bytes_per_token()).sum();
            // A shared layer has its source's shape (the config refuses anything else).
            let shared_bytes: usize = spec
                .shared_layers
                .iter()
                .map(|&l| {
                    let src = cfg.kv_layer_for(l);
                    let layer = &cfg.layers[src];
                    slab_bytes_per_token(
                        KvShape {
                            num_kv_heads: layer.num_kv_heads,
                            head_dim: layer.head_dim,
                        },
                        format,
                    )
                })
                .sum();
            groups.push(KvGroupLayout {
                pool,
                attention: spec.attention,
                window: spec.window,
                owner_layers: spec.layer_ids.clone(),
                shared_layers: spec.shared_layers.clone(),
                slabs: ids,
                unit_bytes,
                unit_bytes_unshared: unit_bytes + shared_bytes,
            });
        }
        if slabs.is_empty() {
            return Err(KvError::NoKvLayers);
        }
        // Slab by owning layer, so that the mapping stays linear in the layer count.
        let mut slab_of = vec![None; cfg.num_layers()];
        for slab in &slabs {
            if let Some(entry) = slab_of.get_mut(slab.layer) {
                *entry = Some(slab);
            }
        }
        let layers_mapping = (0..cfg.num_layers())
            .map(|layer| {
                let source = cfg.kv_layer_for(layer);
                let slab = slab_of.get(source).copied().flatten().ok_or_else(|| {
                    KvError::invalid(
                        "kv_shared_layers",
                        format!("layer {layer} reads layer {source}, which owns no KV"),
                    )
                })?;
                Ok(LayerKv {
                    pool: slab.pool,
                    slab: slab.id,
                    source_layer: source,
                    shared: source != layer,
                })
            })
            .collect::<Result<Vec<_>, KvError>>()?;
        Ok(KvLayout {
            format,
            groups,
            slabs,
            layers_mapping,
        })
    }

    /// Lays out the pool with `auto` resolved against the dtype the checkpoint declares.
    pub fn for_config(cfg: &ModelConfig, dtype: KvCacheDtype) -> Result<KvLayout, KvError> {
        KvLayout::new(cfg, dtype, ModelDtype::from_config(cfg)?)
    }

    /// The stored K/V format of every slab.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Groups in the order of `kv_group_specs()` (full first, then sliding).
    pub fn groups(&self) -> &[KvGroupLayout] {
        &self.groups
    }

    /// The group using `pool`, if the model has one.
    pub fn group(&self, pool: PoolKind) -> Option<&KvGroupLayout> {
        self.groups.iter().find(|g| g.pool == pool)
    }

    /// Every slab, full group first; index with [`SlabId`].
    pub fn slabs(&self) -> &[SlabLayout] {
        &self.slabs
    }

    /// The slab with this id.
    pub fn slab(&self, id: SlabId) -> Option<&SlabLayout> {
        self.slabs.get(id.0)
    }

    /// One entry per model layer, shared layers included.
    pub fn layers_mapping(&self) -> &[LayerKv] {
        &self.layers_mapping
    }

    /// Where `layer` reads its K/V; an error for a layer the model does not have.
    pub fn layer(&self, layer: usize) -> Result<&LayerKv, KvError> {
        self.layers_mapping.get(layer).ok_or(KvError::UnknownLayer {
            layer,
            layers: self.layers_mapping.len(),
        })
    }

    /// Bytes one token costs in `pool` (0 when the model has no such group).
    pub fn unit_bytes(&self, pool: PoolKind) -> usize {
        self.group(pool).map_or(0, |g| g.unit_bytes)
    }

    /// The sliding window, when the model has sliding layers.
    pub fn window(&self) -> Option<usize> {
        self.group(PoolKind::Window).and_then(|g| g.window)
    }

    /// Bytes one token costs while it is held in every group (full and window).
    pub fn kv_cost(&self) -> usize {
        self.groups.iter().map(|g| g.unit_bytes).sum()
    }

    /// [`kv_cost`](Self::kv_cost) if every layer kept its own K/V (for comparison only).
    pub fn kv_cost_unshared(&self) -> usize {
        self.groups.iter().map(|g| g.unit_bytes_unshared).sum()
    }
}
