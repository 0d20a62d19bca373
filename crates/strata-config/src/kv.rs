//! KV sharing and KV groups: which layers own KV, which read another layer's.

use serde::Serialize;

use crate::{AttentionType, ConfigError, LayerConfig, ModelConfig};

/// The K/V shape of one KV-owning layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KvShape {
    /// KV heads of the layer.
    pub num_kv_heads: usize,
    /// Width of one head's key (and value) vector, in elements.
    pub head_dim: usize,
}

/// One attention group (full attention, or sliding with its window): the layers that own KV
/// in it and the layers that read a group member's KV instead. Every consumer of KV layout
/// (pool, model, draft view) reads this one list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvGroupSpec {
    /// The attention type all the group's layers share.
    pub attention: AttentionType,
    /// `Some(W)` for the sliding group.
    pub window: Option<usize>,
    /// Layers that own KV, ascending.
    pub layer_ids: Vec<usize>,
    /// K/V shape of each entry of `layer_ids`, in the same order.
    pub kv_shapes: Vec<KvShape>,
    /// Layers that read the KV of a layer in `layer_ids`, ascending.
    pub shared_layers: Vec<usize>,
}

impl ModelConfig {
    /// One group per attention type present (full first, then sliding). Layers whose
    /// windows differ would need separate groups; the parsers refuse such configs.
    pub fn kv_group_specs(&self) -> Vec<KvGroupSpec> {
        let mut groups = Vec::new();
        for ty in [AttentionType::Full, AttentionType::Sliding] {
            let members: Vec<(usize, &LayerConfig)> = self
                .layers
                .iter()
                .enumerate()
                .filter(|(_, l)| l.attention == ty)
                .collect();
            if members.is_empty() {
                continue;
            }
            let owners: Vec<_> = members.iter().filter(|(_, l)| l.owns_kv()).collect();
            groups.push(KvGroupSpec {
                attention: ty,
                window: members[0].1.window,
                layer_ids: owners.iter().map(|(i, _)| *i).collect(),
                kv_shapes: owners
                    .iter()
                    .map(|(_, l)| KvShape {
                        num_kv_heads: l.num_kv_heads,
                        head_dim: l.head_dim,
                    })
                    .collect(),
                shared_layers: members
                    .iter()
                    .filter(|(_, l)| !l.owns_kv())
                    .map(|(i, _)| *i)
                    .collect(),
            });
        }
        groups
    }
}

/// Marks the last `num_shared` layers as KV-shared and resolves each one's source: the last
/// layer of the same attention type before the first shared layer. Also doubles the MLP of
/// shared layers when `double_wide_mlp` (only when some layer owns KV, as transformers does).
pub(crate) fn assign_kv_sharing(
    layers: &mut [LayerConfig],
    num_shared: usize,
    double_wide_mlp: bool,
    field: &str,
) -> Result<(), ConfigError> {
    let n = layers.len();
    if num_shared > n {
        return Err(ConfigError::invalid(
            field,
            format!("{num_shared} shared layers but the model has only {n} layers"),
        ));
    }
    let first = n - num_shared;
    for l in first..n {
        let ty = layers[l].attention;
        let source = (0..first).rev().find(|&j| layers[j].attention == ty);
        let Some(source) = source else {
            return Err(ConfigError::unsupported(
                field,
                format!(
                    "layer {l} ({}) is KV-shared but no layer before layer {first} has that \
                     attention type to share KV from",
                    ty.hf_name()
                ),
            ));
        };
        let (src_heads, src_dim) = (layers[source].num_kv_heads, layers[source].head_dim);
        if (src_heads, src_dim) != (layers[l].num_kv_heads, layers[l].head_dim) {
            return Err(ConfigError::unsupported(
                field,
                format!(
                    "layer {l} reads the KV of layer {source}, whose shape ({src_heads} heads x \
                     {src_dim}) differs from its own ({} x {})",
                    layers[l].num_kv_heads, layers[l].head_dim
                ),
            ));
        }
        layers[l].kv_source = Some(source);
        if double_wide_mlp && first > 0 {
            layers[l].intermediate_size *= 2;
        }
    }
    Ok(())
}
