//! Slabs in host memory.

use crate::quant::{decode_row, encode_row};
use crate::{KvError, KvFormat, KvLayout, KvStorage, PagePlan, SlabId, SlabLayout};

/// Value bytes backed by `u64` words, so rows of 2- and 4-byte elements are naturally
/// aligned for vector loads.
#[derive(Clone, Debug, Default)]
struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn zeroed(len: usize) -> Self {
        AlignedBytes {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

#[derive(Clone, Debug)]
struct SlabBuffers {
    num_kv_heads: usize,
    head_dim: usize,
    format: KvFormat,
    slots: usize,
    k: AlignedBytes,
    v: AlignedBytes,
    k_scales: Vec<f32>,
    v_scales: Vec<f32>,
}

impl SlabBuffers {
    fn new(slab: &SlabLayout, slots: usize) -> Self {
        let values = slots * slab.value_bytes_per_token();
        let scales = slots * slab.scales_per_token();
        SlabBuffers {
            num_kv_heads: slab.num_kv_heads,
            head_dim: slab.head_dim,
            format: slab.format,
            slots,
            k: AlignedBytes::zeroed(values),
            v: AlignedBytes::zeroed(values),
            k_scales: vec![0.0; scales],
            v_scales: vec![0.0; scales],
        }
    }

    fn bytes(&self) -> u64 {
        (2 * self.k.len + 4 * (self.k_scales.len() + self.v_scales.len())) as u64
    }
}

/// One slab's bytes, borrowed for a kernel. Row `slot` of head `h` starts at element
/// `(slot * num_kv_heads + h) * head_dim`; its scale (8-bit formats) is
/// `k_scales[slot * num_kv_heads + h]`.
#[derive(Clone, Copy, Debug)]
pub struct HostSlab<'a> {
    /// How the elements are stored.
    pub format: KvFormat,
    /// KV heads of the owning layer.
    pub num_kv_heads: usize,
    /// Width of one head's key (and value) vector, in elements.
    pub head_dim: usize,
    /// Token slots the slab holds.
    pub slots: usize,
    /// K values, `slots * num_kv_heads * head_dim` elements.
    pub k: &'a [u8],
    /// V values, laid out as `k`.
    pub v: &'a [u8],
    /// Empty for formats without scales.
    pub k_scales: &'a [f32],
    /// V scales, laid out as `k_scales`.
    pub v_scales: &'a [f32],
}

/// One slab's bytes, borrowed mutably (same layout as [`HostSlab`]).
#[derive(Debug)]
pub struct HostSlabMut<'a> {
    /// How the elements are stored.
    pub format: KvFormat,
    /// KV heads of the owning layer.
    pub num_kv_heads: usize,
    /// Width of one head's key (and value) vector, in elements.
    pub head_dim: usize,
    /// Token slots the slab holds.
    pub slots: usize,
    /// K values, `slots * num_kv_heads * head_dim` elements.
    pub k: &'a mut [u8],
    /// V values, laid out as `k`.
    pub v: &'a mut [u8],
    /// K scales, one per slot and KV head; empty for formats without scales.
    pub k_scales: &'a mut [f32],
    /// V scales, laid out as `k_scales`.
    pub v_scales: &'a mut [f32],
}

/// Every slab of a layout in host memory.
#[derive(Clone, Debug, Default)]
pub struct HostStorage {
    slabs: Vec<SlabBuffers>,
}

impl HostStorage {
    /// Empty storage; the pool sizes it
    /// ([`KvStorage::reserve`](crate::KvStorage::reserve)).
    pub fn new() -> Self {
        HostStorage::default()
    }

    /// A slab's buffers to read, or `None` for an id the storage has not reserved.
    pub fn slab(&self, id: SlabId) -> Option<HostSlab<'_>> {
        self.slabs.get(id.0).map(|s| HostSlab {
            format: s.format,
            num_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            slots: s.slots,
            k: s.k.bytes(),
            v: s.v.bytes(),
            k_scales: &s.k_scales,
            v_scales: &s.v_scales,
        })
    }

    /// A slab's buffers to write, or `None` for an id the storage has not reserved.
    pub fn slab_mut(&mut self, id: SlabId) -> Option<HostSlabMut<'_>> {
        self.slabs.get_mut(id.0).map(|s| HostSlabMut {
            format: s.format,
            num_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            slots: s.slots,
            k: s.k.bytes_mut(),
            v: s.v.bytes_mut(),
            k_scales: &mut s.k_scales,
            v_scales: &mut s.v_scales,
        })
    }

    /// Quantizes one token's K and V (all heads, `num_kv_heads * head_dim` values each) into
    /// `slot` of `slab`.
    pub fn write_token(
        &mut self,
        slab: SlabId,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let s = self
            .slabs
            .get_mut(slab.0)
            .ok_or_else(|| unknown_slab(slab))?;
        check_row(s, slot, k.len(), v.len())?;
        let (heads, dim, eb) = (s.num_kv_heads, s.head_dim, s.format.element_bytes());
        for h in 0..heads {
            let row = slot * heads + h;
            let bytes = row * dim * eb..(row + 1) * dim * eb;
            let src = h * dim..(h + 1) * dim;
            let k_scale = encode_row(
                s.format,
                &k[src.clone()],
                &mut s.k.bytes_mut()[bytes.clone()],
            );
            let v_scale = encode_row(s.format, &v[src], &mut s.v.bytes_mut()[bytes]);
            if s.format.has_scales() {
                s.k_scales[row] = k_scale;
                s.v_scales[row] = v_scale;
            }
        }
        Ok(())
    }

    /// Dequantizes one token's K and V (all heads) from `slot` of `slab`.
    pub fn read_token(
        &self,
        slab: SlabId,
        slot: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError> {
        let s = self.slabs.get(slab.0).ok_or_else(|| unknown_slab(slab))?;
        check_row(s, slot, k.len(), v.len())?;
        let (heads, dim, eb) = (s.num_kv_heads, s.head_dim, s.format.element_bytes());
        for h in 0..heads {
            let row = slot * heads + h;
            let bytes = row * dim * eb..(row + 1) * dim * eb;
            let dst = h * dim..(h + 1) * dim;
            let (ks, vs) = if s.format.has_scales() {
                (s.k_scales[row], s.v_scales[row])
            } else {
                (1.0, 1.0)
            };
            decode_row(
                s.format,
                &s.k.bytes()[bytes.clone()],
                ks,
                &mut k[dst.clone()],
            );
            decode_row(s.format, &s.v.bytes()[bytes], vs, &mut v[dst]);
        }
        Ok(())
    }
}

fn unknown_slab(slab: SlabId) -> KvError {
    KvError::invalid("slab", format!("no slab {}", slab.0))
}

fn check_row(s: &SlabBuffers, slot: usize, k_len: usize, v_len: usize) -> Result<(), KvError> {
    if slot >= s.slots {
        return Err(KvError::SlotOutOfRange {
            slot,
            slots: s.slots,
        });
    }
    let want = s.num_kv_heads * s.head_dim;
    if k_len != want || v_len != want {
        return Err(KvError::invalid(
            "kv row",
            format!("expected {want} values for K and for V, got {k_len} and {v_len}"),
        ));
    }
    Ok(())
}

impl KvStorage for HostStorage {
    fn reserve(&mut self, layout: &KvLayout, plan: &PagePlan) -> Result<(), KvError> {
        let mut slabs = Vec::with_capacity(layout.slabs().len());
        for slab in layout.slabs() {
            let slots = plan.slots(slab.pool);
            let bytes = slots
                .checked_mul(slab.bytes_per_token())
                .ok_or_else(|| KvError::Storage(format!("slab {} size overflows", slab.id.0)))?;
            if bytes > isize::MAX as usize {
                return Err(KvError::Storage(format!(
                    "slab {} needs {bytes} bytes",
                    slab.id.0
                )));
            }
            slabs.push(SlabBuffers::new(slab, slots));
        }
        self.slabs = slabs;
        Ok(())
    }

    fn bytes_reserved(&self) -> u64 {
        self.slabs.iter().map(SlabBuffers::bytes).sum()
    }
}
