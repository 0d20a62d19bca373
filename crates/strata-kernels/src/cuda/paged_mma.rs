//! Tensor-core paged attention (`kernels/paged_mma.cu`): in the bf16 speed mode, bf16 slabs
//! are attended one KV head's whole query group per block, so each key is read once per
//! group (`decode_attention_mma_d<D>` in the FlashAttention-2 layout at head_dim 64 to 512,
//! `paged_attention_mma` at the other multiples of 64); the 8-bit slabs (fp8 / int8 per
//! token-head) take the FlashAttention-2 layout's own entry points at head_dim 64 to 512
//! (`decode_attention_mma_{fp8,int8}_d<D>`: f16 mma on the codes, scales applied to the
//! scores and probabilities); their long query runs take the prefill kernel's 8-bit entry
//! points (`prefill_attention_mma_{fp8,int8}_d<D>`: each tile converted once to f16).
//! Everything else (f32 / f16 slabs, the exact path, other head_dims, groups over 16 heads)
//! keeps the CUDA-core kernel.

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::CudaContext;

use super::module::Kernels;
use crate::{AttentionParams, KvFormat};

pub(super) const KERNEL: &str = "paged_attention_mma";
/// Keys per tile, query rows per block, padding per shared row: `PM_*` in the kernel.
const KT: usize = 32;
pub(super) const ROWS: usize = 16;
const PAD: usize = 8;
pub(super) const MAX_D: usize = 512;
pub(super) const THREADS: u32 = 256;

/// Pipeline depths the kernel takes: tiles loading or in use at once.
const MAX_STAGES: usize = 3;
const MIN_STAGES: usize = 2;

/// The prefill kernels' block size (`PF_WARPS` warps) and the largest query group they take.
pub(super) const PREFILL_THREADS: u32 = 256;
const PREFILL_WARPS: usize = 8;
const PREFILL_MAX_GROUP: usize = 64;

/// The prefill kernels for the 8-bit slabs: (head_dim, fp8 entry point and its `_seqs_`
/// twin, int8 entry point and twin). f16 mma on the codes, converted once a tile.
const PREFILL_SCALED_KERNELS: [(usize, [&str; 2], [&str; 2]); 4] = [
    (
        64,
        [
            "prefill_attention_mma_fp8_d64",
            "prefill_attention_mma_fp8_seqs_d64",
        ],
        [
            "prefill_attention_mma_int8_d64",
            "prefill_attention_mma_int8_seqs_d64",
        ],
    ),
    (
        128,
        [
            "prefill_attention_mma_fp8_d128",
            "prefill_attention_mma_fp8_seqs_d128",
        ],
        [
            "prefill_attention_mma_int8_d128",
            "prefill_attention_mma_int8_seqs_d128",
        ],
    ),
    (
        256,
        [
            "prefill_attention_mma_fp8_d256",
            "prefill_attention_mma_fp8_seqs_d256",
        ],
        [
            "prefill_attention_mma_int8_d256",
            "prefill_attention_mma_int8_seqs_d256",
        ],
    ),
    (
        512,
        [
            "prefill_attention_mma_fp8_d512",
            "prefill_attention_mma_fp8_seqs_d512",
        ],
        [
            "prefill_attention_mma_int8_d512",
            "prefill_attention_mma_int8_seqs_d512",
        ],
    ),
];

/// How the prefill kernel for a head_dim cuts its work (`prefill_attention_body<D>`): each
/// warp owns 16 query rows and `d / slices` columns, so a block takes
/// 16 x warps / slices rows, and keys come in tiles of `kt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PrefillShape {
    pub kernel: &'static str,
    /// The entry point that takes several sequences in one launch.
    pub seqs_kernel: &'static str,
    pub rows: usize,
    kt: usize,
    slices: usize,
}

/// The head_dims with a prefill kernel (one entry point each: the column loops unroll
/// without a branch); other head_dims take the GEMM path.
const PREFILL_KERNELS: [(usize, &str, &str); 4] = [
    (
        64,
        "prefill_attention_mma_d64",
        "prefill_attention_mma_seqs_d64",
    ),
    (
        128,
        "prefill_attention_mma_d128",
        "prefill_attention_mma_seqs_d128",
    ),
    (
        256,
        "prefill_attention_mma_d256",
        "prefill_attention_mma_seqs_d256",
    ),
    (
        512,
        "prefill_attention_mma_d512",
        "prefill_attention_mma_seqs_d512",
    ),
];

/// Up to d 256 a warp holds all of d (128 rows a block, 64-key tiles); at d 512 the pair
/// of warps on the same rows halves d (64 rows, 32-key tiles), so the output stays at 128
/// registers a lane. The entry points are `format`'s (bf16 or an 8-bit per-token-head
/// slab). None: no kernel for this head_dim and format.
pub(super) fn prefill_shape(d: usize, format: KvFormat) -> Option<PrefillShape> {
    let (kernel, seqs_kernel) = match format {
        KvFormat::Bf16 => PREFILL_KERNELS
            .iter()
            .find(|&&(kd, _, _)| kd == d)
            .map(|&(_, one, seqs)| (one, seqs))?,
        KvFormat::Fp8E4m3PerTokenHead | KvFormat::Int8PerTokenHead => {
            let &(_, fp8, int8) = PREFILL_SCALED_KERNELS.iter().find(|&&(kd, _, _)| kd == d)?;
            let [one, seqs] = if format == KvFormat::Fp8E4m3PerTokenHead {
                fp8
            } else {
                int8
            };
            (one, seqs)
        }
        _ => return None,
    };
    let (kt, slices) = if d <= 256 { (64, 1) } else { (32, 2) };
    Some(PrefillShape {
        kernel,
        seqs_kernel,
        rows: 16 * PREFILL_WARPS / slices,
        kt,
        slices,
    })
}

/// The decode kernels in the FlashAttention-2 layout (`decode_attention_mma_d<D>`): the same
/// parameters, grid and results as `KERNEL`, one entry point per head_dim.
const DECODE_KERNELS: [(usize, &str); 4] = [
    (64, "decode_attention_mma_d64"),
    (128, "decode_attention_mma_d128"),
    (256, "decode_attention_mma_d256"),
    (512, "decode_attention_mma_d512"),
];
/// The same kernels for the 8-bit slabs: (head_dim, fp8 entry point, int8 entry point).
const DECODE_SCALED_KERNELS: [(usize, &str, &str); 4] = [
    (
        64,
        "decode_attention_mma_fp8_d64",
        "decode_attention_mma_int8_d64",
    ),
    (
        128,
        "decode_attention_mma_fp8_d128",
        "decode_attention_mma_int8_d128",
    ),
    (
        256,
        "decode_attention_mma_fp8_d256",
        "decode_attention_mma_int8_d256",
    ),
    (
        512,
        "decode_attention_mma_fp8_d512",
        "decode_attention_mma_int8_d512",
    ),
];

/// The 8-bit formats the decode kernels read, and their entry point for head_dim `d`.
fn scaled_kernel(format: KvFormat, d: usize) -> Option<&'static str> {
    let &(_, fp8, int8) = DECODE_SCALED_KERNELS.iter().find(|&&(kd, _, _)| kd == d)?;
    match format {
        KvFormat::Fp8E4m3PerTokenHead => Some(fp8),
        KvFormat::Int8PerTokenHead => Some(int8),
        _ => None,
    }
}

/// Keys a tile, warp groups a block and the blocks a multiprocessor holds by registers
/// (`DA_KT`, `DA_GROUPS` and the entry points' launch bounds).
const DECODE_KT: usize = 16;
const DECODE_GROUPS: usize = 2;
fn decode_blocks_by_registers(d: usize) -> usize {
    if d > 256 {
        1
    } else {
        2
    }
}

/// Dynamic shared memory of a decode kernel block (`decode_attention_body`): Q, two stages of
/// K and V tiles for each warp group (bf16), the groups' partial S exchange (f32).
pub(super) fn decode_smem_bytes(d: usize) -> usize {
    let ld = d + PAD;
    (ROWS * ld + DECODE_GROUPS * 2 * 2 * DECODE_KT * ld) * 2 + DECODE_GROUPS * 4 * 8 * 32 * 4
}

/// The same for an 8-bit slab (`decode_attention_body` with a raw format): Q; per warp
/// group three raw stages (a tile's K codes in rows of d + 16 bytes, its V codes in rows
/// of 5 d / 4, its K and V scales in f32) and the V tile converted to f16; the partial S
/// exchange.
pub(super) fn decode_scaled_smem_bytes(d: usize) -> usize {
    const RAW_STAGES: usize = 3;
    let ld = d + PAD;
    let raw_stage = DECODE_KT * ((d + 16) + (d + d / 4)) + 2 * DECODE_KT * 4;
    ROWS * ld * 2
        + DECODE_GROUPS * (RAW_STAGES * raw_stage + DECODE_KT * ld * 2)
        + DECODE_GROUPS * 4 * 8 * 32 * 4
}

/// Dynamic shared memory of one block for `head_dim` d and `stages` K/V tile buffers (the
/// kernel's layout: Q and the K and V tiles in bf16, S in f32, P in bf16, one factor per
/// row).
pub(super) fn smem_bytes(d: usize, stages: usize) -> usize {
    let ld = d + PAD;
    (ROWS * ld + 2 * stages * KT * ld) * 2 + 2 * ROWS * KT * 4 + ROWS * (KT + PAD) * 2 + ROWS * 4
}

/// The prefill kernel's dynamic shared memory: Q's rows and `stages` K and V tiles in bf16,
/// and with two slices each warp's partial S (16 x kt f32). An 8-bit slab's kernel holds
/// `stages` raw tiles instead (a tile's K and V codes, kt x d bytes each, and their f32
/// scales) and one f16 K and V tile. None: no kernel for `d` and `format`.
pub(super) fn prefill_smem_bytes(d: usize, format: KvFormat, stages: usize) -> Option<usize> {
    let (ld, s) = (d + PAD, prefill_shape(d, format)?);
    let exchange = if s.slices > 1 {
        PREFILL_WARPS * 16 * s.kt * 4
    } else {
        0
    };
    let tiles = if format == KvFormat::Bf16 {
        2 * stages * s.kt * ld * 2
    } else {
        stages * (2 * s.kt * d + 2 * s.kt * 4) + 2 * s.kt * ld * 2
    };
    Some(s.rows * ld * 2 + tiles + exchange)
}

/// What both tensor-core kernels need of a call: the bf16 mode on a bf16 slab, head_dim a
/// multiple of 64 up to MAX_D, and a query group of at most `max_group` heads.
fn takes_mma(bf16_mode: bool, format: KvFormat, p: &AttentionParams, max_group: usize) -> bool {
    let d = p.head_dim;
    bf16_mode
        && format == KvFormat::Bf16
        && d > 0
        && d.is_multiple_of(64)
        && d <= MAX_D
        && p.n_kv_heads > 0
        && p.n_heads / p.n_kv_heads <= max_group
}

/// What the device grants the kernels.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MmaSupport {
    /// Dynamic shared memory a block may use (0: the kernel is not used).
    pub smem_limit: usize,
    /// Shared memory of one multiprocessor (how many blocks run side by side).
    pub smem_per_sm: usize,
    /// The same for the prefill kernel (0: not used).
    pub prefill_smem_limit: usize,
    /// Whether decode rows take the FlashAttention-2 layout kernels (their shared memory
    /// granted; else `KERNEL`).
    pub decode_fa: bool,
    /// Whether decode rows over 8-bit slabs take the tensor-core kernels (their shared
    /// memory granted; else the CUDA-core kernel).
    pub decode_scaled: bool,
    /// Whether long query runs over 8-bit slabs take the tensor-core prefill kernels
    /// (granted; else the GEMM path).
    pub prefill_scaled: bool,
}

impl MmaSupport {
    /// The GPU needs bf16 mma (sm_80+), and the block size for the largest head_dim is
    /// granted up to the device's opt-in limit.
    pub(super) fn probe(ctx: &CudaContext, arch: u32, kernels: &Kernels) -> Self {
        if arch < 80 {
            return Self::default();
        }
        let attr = |a| ctx.attribute(a).map_or(0, |v: i32| v.max(0) as usize);
        let optin = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
        let per_sm =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
        let grant = |name: &'static str, limit: usize| {
            kernels.get(name).is_ok_and(|f| {
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    limit as i32,
                )
                .is_ok()
            })
        };
        let limit = optin.min(smem_bytes(MAX_D, MAX_STAGES));
        if !grant(KERNEL, limit) {
            return Self::default();
        }
        let prefill_limit = PREFILL_KERNELS
            .iter()
            .filter_map(|&(d, _, _)| prefill_smem_bytes(d, KvFormat::Bf16, MAX_STAGES))
            .max()
            .map_or(0, |most| optin.min(most));
        let granted = PREFILL_KERNELS
            .iter()
            .all(|&(_, one, seqs)| grant(one, prefill_limit) && grant(seqs, prefill_limit));
        // Granted as the bf16 entry points are; whether a head_dim's blocks fit the grant is
        // `prefill_applies`'s per-call check (on a 163 KB GPU d 64 and 128 fit, 256 does not).
        let prefill_scaled = PREFILL_SCALED_KERNELS
            .iter()
            .all(|&(_, fp8, int8)| fp8.iter().chain(&int8).all(|&k| grant(k, prefill_limit)));
        Self {
            smem_limit: limit,
            smem_per_sm: per_sm.max(limit),
            prefill_smem_limit: if granted { prefill_limit } else { 0 },
            decode_fa: DECODE_KERNELS.iter().all(|&(d, kernel)| {
                decode_smem_bytes(d) <= optin && grant(kernel, decode_smem_bytes(d))
            }),
            decode_scaled: DECODE_SCALED_KERNELS.iter().all(|&(d, fp8, int8)| {
                let bytes = decode_scaled_smem_bytes(d);
                bytes <= optin && grant(fp8, bytes) && grant(int8, bytes)
            }),
            prefill_scaled: granted && prefill_scaled,
        }
    }

    /// The decode kernel for head_dim `d` and its shared memory: the FlashAttention-2
    /// layout's entry point where there is one, else `KERNEL` at its deepest pipeline.
    /// An 8-bit slab's kernel is its format's entry point (`applies` admits no other).
    pub(super) fn decode_kernel(&self, d: usize, format: KvFormat) -> (&'static str, usize) {
        if let Some(kernel) = scaled_kernel(format, d) {
            return (kernel, decode_scaled_smem_bytes(d));
        }
        match DECODE_KERNELS.iter().find(|&&(kd, _)| kd == d) {
            Some(&(_, kernel)) if self.decode_fa => (kernel, decode_smem_bytes(d)),
            _ => (KERNEL, smem_bytes(d, self.stages(d))),
        }
    }

    /// Whether an attention call takes the tensor-core kernel.
    pub(super) fn applies(&self, bf16_mode: bool, format: KvFormat, p: &AttentionParams) -> bool {
        if scaled_kernel(format, p.head_dim).is_some() {
            return self.decode_scaled && takes_mma(bf16_mode, KvFormat::Bf16, p, ROWS);
        }
        takes_mma(bf16_mode, format, p, ROWS)
            && smem_bytes(p.head_dim, MIN_STAGES) <= self.smem_limit
    }

    /// Whether a sequence's long query run takes the prefill kernel: the decode kernel's
    /// conditions, with groups of up to PREFILL_MAX_GROUP query heads; 8-bit slabs take
    /// their own entry points unless `prefill_scaled` is off.
    pub(super) fn prefill_applies(
        &self,
        bf16_mode: bool,
        format: KvFormat,
        p: &AttentionParams,
    ) -> bool {
        let scaled = matches!(
            format,
            KvFormat::Fp8E4m3PerTokenHead | KvFormat::Int8PerTokenHead
        );
        let slab_ok = if scaled {
            self.prefill_scaled
        } else {
            format == KvFormat::Bf16
        };
        slab_ok
            && takes_mma(bf16_mode, KvFormat::Bf16, p, PREFILL_MAX_GROUP)
            && p.n_heads.is_multiple_of(p.n_kv_heads)
            && prefill_smem_bytes(p.head_dim, format, MIN_STAGES)
                .is_some_and(|b| b <= self.prefill_smem_limit)
    }

    /// The prefill kernel's pipeline depth for head_dim `d` over a `format` slab.
    pub(super) fn prefill_stages(&self, d: usize, format: KvFormat) -> usize {
        (MIN_STAGES..=MAX_STAGES)
            .rev()
            .find(|&s| {
                prefill_smem_bytes(d, format, s).is_some_and(|b| b <= self.prefill_smem_limit)
            })
            .unwrap_or(MIN_STAGES)
    }

    /// The deepest pipeline whose blocks fit the granted shared memory (the kernel's
    /// `n_stages`).
    pub(super) fn stages(&self, d: usize) -> usize {
        (MIN_STAGES..=MAX_STAGES)
            .rev()
            .find(|&s| smem_bytes(d, s) <= self.smem_limit)
            .unwrap_or(MIN_STAGES)
    }

    /// Blocks of head_dim `d` the whole GPU runs at once.
    pub(super) fn resident_blocks(&self, d: usize, format: KvFormat, sm_count: usize) -> usize {
        // About 1 KB of each multiprocessor's shared memory is reserved per block.
        let (kernel, smem) = self.decode_kernel(d, format);
        let by_smem = (self.smem_per_sm / (smem + 1024)).max(1);
        let per_sm = if kernel == KERNEL {
            by_smem
        } else {
            by_smem.min(decode_blocks_by_registers(d))
        };
        sm_count * per_sm
    }
}

/// Key splits for `blocks` (query row, KV head) blocks: the most splits whose grid still
/// fits one wave of `resident` blocks, at most `max`. A grid just past one wave runs its
/// last blocks after the rest: 96 decode rows of E2B's d-256 layers made 288 blocks for
/// 264 places at three splits; at two the step is 4.37-4.39 ms against 4.61 on an H200.
pub(super) fn wave_splits(blocks: usize, resident: usize, max: usize) -> usize {
    (resident / blocks.max(1)).clamp(1, max)
}

/// Keys a decode split takes at least where a graph fixes the splits: a tile for each warp
/// group of the FlashAttention-2 layout kernels (`DA_KT` x `DA_GROUPS`), one tile of the
/// original kernel (`PM_KT`).
pub(super) const GRAPH_SPLIT_KEYS: usize = DECODE_KT * DECODE_GROUPS;

/// The most key splits a captured decode step gives a layer with `window`. A graph replays at
/// any depth, so its splits are not sized by the rows' keys; but a windowed layer's row sees
/// at most `window` keys, and a split shorter than a tile a warp group leaves one group of
/// its block idle and the combine more parts to read (E2B's 512-key window at 8 rows took
/// 33 splits of one 16-key tile each).
pub(super) fn graph_split_cap(window: Option<usize>, max: usize) -> usize {
    window.map_or(max, |w| w.div_ceil(GRAPH_SPLIT_KEYS).clamp(1, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0,
            window: None,
            causal: true,
            softcap: None,
        }
    }

    #[test]
    fn shared_memory_fits_hopper_for_gemma4_head_dims() {
        // H100/H200 grant 227 KB a block and hold 228 KB a multiprocessor; A100 163 KB.
        assert_eq!(smem_bytes(512, 2), 155_200);
        assert_eq!(smem_bytes(512, 3), 221_760);
        let hopper = MmaSupport {
            smem_limit: 227 * 1024,
            smem_per_sm: 228 * 1024,
            prefill_smem_limit: 227 * 1024,
            decode_fa: false,
            decode_scaled: false,
            prefill_scaled: false,
        };
        assert_eq!(hopper.stages(512), 3);
        assert_eq!(hopper.stages(256), 3);
        assert_eq!(
            hopper.resident_blocks(256, KvFormat::Bf16, 1),
            2,
            "two d-256 blocks a multiprocessor"
        );
        // The FlashAttention-2 layout decode kernels: two d-256 blocks a multiprocessor
        // (shared memory would hold more; registers do not), one at d 512.
        let fa = MmaSupport {
            decode_fa: true,
            ..hopper
        };
        assert_eq!(decode_smem_bytes(256), 84_224);
        assert_eq!(decode_smem_bytes(512), 157_952);
        let bf16 = KvFormat::Bf16;
        assert_eq!(
            fa.decode_kernel(256, bf16),
            ("decode_attention_mma_d256", 84_224)
        );
        assert_eq!(
            fa.decode_kernel(320, bf16).0,
            KERNEL,
            "no entry point: the original kernel"
        );
        assert_eq!(fa.resident_blocks(256, bf16, 1), 2);
        assert_eq!(fa.resident_blocks(512, bf16, 1), 1);
        assert_eq!(fa.resident_blocks(64, bf16, 1), 2);
        // The 8-bit slabs: raw stages of half the bytes plus a decoded tile; the same
        // blocks a multiprocessor.
        let fp8 = KvFormat::Fp8E4m3PerTokenHead;
        assert_eq!(decode_scaled_smem_bytes(256), 91_136);
        assert_eq!(decode_scaled_smem_bytes(512), 171_008);
        assert_eq!(
            fa.decode_kernel(256, fp8),
            ("decode_attention_mma_fp8_d256", 91_136)
        );
        assert_eq!(
            fa.decode_kernel(512, KvFormat::Int8PerTokenHead).0,
            "decode_attention_mma_int8_d512"
        );
        assert_eq!(fa.resident_blocks(256, fp8, 1), 2);
        assert_eq!(fa.resident_blocks(512, fp8, 1), 1);
        let ampere = MmaSupport {
            smem_limit: 163 * 1024,
            smem_per_sm: 164 * 1024,
            prefill_smem_limit: 163 * 1024,
            decode_fa: false,
            decode_scaled: false,
            prefill_scaled: false,
        };
        assert_eq!(ampere.stages(512), 2);
        // The prefill kernels: d 256 and 512 in two stages on Hopper; on A100 (163 KB) only
        // up to d 128 (d 256's 128 rows and 64-key tiles take 198 KB), the rest take the
        // GEMM path.
        assert_eq!(prefill_smem_bytes(512, bf16, 2), Some(216_064));
        assert_eq!(prefill_smem_bytes(256, bf16, 2), Some(202_752));
        assert_eq!(prefill_smem_bytes(128, bf16, 3), Some(139_264));
        assert_eq!(
            prefill_smem_bytes(192, bf16, 2),
            None,
            "no kernel: the GEMM path"
        );
        assert_eq!(hopper.prefill_stages(512, bf16), 2);
        assert_eq!(hopper.prefill_stages(256, bf16), 2);
        assert_eq!(hopper.prefill_stages(128, bf16), 3);
        // The 8-bit slabs' prefill kernels: raw stages of half a bf16 stage's bytes plus one
        // f16 K and V tile; the same stage counts on Hopper.
        assert_eq!(prefill_smem_bytes(512, fp8, 2), Some(215_552));
        assert_eq!(prefill_smem_bytes(256, fp8, 2), Some(201_728));
        assert_eq!(prefill_smem_bytes(256, fp8, 3), Some(235_008));
        assert_eq!(prefill_smem_bytes(128, fp8, 3), Some(120_320));
        assert_eq!(prefill_smem_bytes(256, KvFormat::F16, 2), None);
        assert_eq!(hopper.prefill_stages(256, fp8), 2);
        assert_eq!(hopper.prefill_stages(512, fp8), 2);
        assert_eq!(hopper.prefill_stages(128, fp8), 3);
        let e2b_full = params(8, 1, 512);
        assert!(hopper.prefill_applies(true, KvFormat::Bf16, &e2b_full));
        assert!(hopper.prefill_applies(true, KvFormat::Bf16, &params(8, 1, 256)));
        assert!(!ampere.prefill_applies(true, KvFormat::Bf16, &e2b_full));
        assert!(!ampere.prefill_applies(true, KvFormat::Bf16, &params(8, 1, 256)));
        assert!(ampere.prefill_applies(true, KvFormat::Bf16, &params(8, 1, 128)));
        assert!(hopper.prefill_applies(true, KvFormat::Bf16, &params(32, 1, 128)));
        assert!(hopper.prefill_applies(true, KvFormat::Bf16, &params(64, 1, 512)));
        assert!(hopper.prefill_applies(true, KvFormat::Bf16, &params(4, 2, 64)));
        assert!(!hopper.prefill_applies(true, KvFormat::Bf16, &params(8, 1, 320)));
        assert!(!hopper.prefill_applies(true, KvFormat::Bf16, &params(128, 1, 128)));
        assert!(!hopper.prefill_applies(false, KvFormat::Bf16, &e2b_full));
        // 8-bit slabs only where their kernels were granted.
        let int8 = KvFormat::Int8PerTokenHead;
        assert!(!hopper.prefill_applies(true, fp8, &e2b_full));
        let scaled = MmaSupport {
            prefill_scaled: true,
            ..hopper
        };
        for f in [fp8, int8] {
            assert!(scaled.prefill_applies(true, f, &e2b_full));
            assert!(scaled.prefill_applies(true, f, &params(8, 1, 256)));
            assert!(!scaled.prefill_applies(false, f, &e2b_full));
            assert!(!scaled.prefill_applies(true, f, &params(8, 1, 320)));
        }
        assert!(!scaled.prefill_applies(true, KvFormat::F16, &e2b_full));
        assert!(!scaled.prefill_applies(true, KvFormat::F32, &e2b_full));
        let ampere_scaled = MmaSupport {
            prefill_scaled: true,
            ..ampere
        };
        assert!(!ampere_scaled.prefill_applies(true, fp8, &params(8, 1, 256)));
        assert!(ampere_scaled.prefill_applies(true, fp8, &params(8, 1, 128)));
    }

    fn support(smem_limit: usize) -> MmaSupport {
        MmaSupport {
            smem_limit,
            smem_per_sm: 228 * 1024,
            prefill_smem_limit: 0,
            decode_fa: false,
            decode_scaled: false,
            prefill_scaled: false,
        }
    }

    #[test]
    fn only_bf16_slabs_in_bf16_mode_with_whole_tiles() {
        let full = support(smem_bytes(MAX_D, 2));
        let e2b = params(8, 1, 512);
        assert!(full.applies(true, KvFormat::Bf16, &e2b));
        assert!(!full.applies(false, KvFormat::Bf16, &e2b));
        assert!(!full.applies(true, KvFormat::F32, &e2b));
        assert!(!full.applies(true, KvFormat::Fp8E4m3PerTokenHead, &e2b));
        // The 8-bit slabs where their kernels were granted: head_dims with an entry point,
        // groups up to 16, the bf16 mode.
        let scaled = MmaSupport {
            decode_scaled: true,
            ..full
        };
        for f in [KvFormat::Fp8E4m3PerTokenHead, KvFormat::Int8PerTokenHead] {
            assert!(scaled.applies(true, f, &e2b));
            assert!(scaled.applies(true, f, &params(8, 2, 64)));
            assert!(!scaled.applies(false, f, &e2b));
            assert!(!scaled.applies(true, f, &params(8, 1, 320)));
            assert!(!scaled.applies(true, f, &params(32, 1, 128)));
        }
        assert!(!scaled.applies(true, KvFormat::F16, &e2b));
        assert!(!full.applies(true, KvFormat::Bf16, &params(8, 1, 96)));
        assert!(!full.applies(true, KvFormat::Bf16, &params(32, 1, 128)));
        let small = support(smem_bytes(256, 2));
        assert!(!small.applies(true, KvFormat::Bf16, &e2b));
        assert!(small.applies(true, KvFormat::Bf16, &params(8, 2, 256)));
        assert!(!MmaSupport::default().applies(true, KvFormat::Bf16, &params(8, 2, 256)));
    }

    #[test]
    fn splits_fill_one_wave() {
        let h200 = support(227 * 1024);
        // E2B on 132 multiprocessors: one d-512 block or two d-256 blocks each.
        assert_eq!(h200.resident_blocks(512, KvFormat::Bf16, 132), 132);
        assert_eq!(h200.resident_blocks(256, KvFormat::Bf16, 132), 264);
        assert_eq!(wave_splits(128, 132, 64), 1);
        assert_eq!(wave_splits(128, 264, 64), 2);
        assert_eq!(wave_splits(64, 132, 64), 2);
        assert_eq!(wave_splits(8, 132, 64), 16);
        assert_eq!(wave_splits(100, 264, 64), 2, "never past one wave");
        assert_eq!(wave_splits(1, 132, 64), 64);
        assert_eq!(wave_splits(500, 132, 64), 1);
        assert_eq!(wave_splits(0, 132, 64), 64);
    }

    #[test]
    fn graph_splits_of_a_window_keep_a_tile_a_warp_group() {
        assert_eq!(GRAPH_SPLIT_KEYS, 32);
        assert_eq!(graph_split_cap(Some(512), 64), 16);
        assert_eq!(graph_split_cap(Some(513), 64), 17);
        assert_eq!(graph_split_cap(Some(10), 64), 1);
        assert_eq!(graph_split_cap(Some(1 << 20), 64), 64);
        assert_eq!(graph_split_cap(None, 64), 64);
    }
}
