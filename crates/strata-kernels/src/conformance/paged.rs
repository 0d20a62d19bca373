//! Paged KV: the store must produce exactly the pool's host encoding (bytes and scales, per
//! format), and paged attention over a slab must equal attention by the definition over the
//! dequantized rows, for batches of sequences at different positions whose keys sit in
//! scattered slots (sliding windows, GQA, head_dim up to 512, split-K decode).

use strata_kv::quant::{decode_row, encode_row};

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{
    has_scales, AttentionParams, Backend, KvFormat, KvSlabContents, KvSlabShape, PagedSeq,
};

/// Every KV format a slab may have, each checked by the paged cases.
pub const ALL_FORMATS: [KvFormat; 5] = [
    KvFormat::F32,
    KvFormat::Bf16,
    KvFormat::F16,
    KvFormat::Fp8E4m3PerTokenHead,
    KvFormat::Int8PerTokenHead,
];

/// Encodes rows `[T, heads, d]` into `slots` of host contents, as the pool does.
fn host_store(shape: KvSlabShape, c: &mut KvSlabContents, k: &[f32], v: &[f32], slots: &[u32]) {
    let (heads, d, eb) = (
        shape.num_kv_heads,
        shape.head_dim,
        shape.format.element_bytes(),
    );
    for (t, &slot) in slots.iter().enumerate() {
        for h in 0..heads {
            let row = slot as usize * heads + h;
            let src = (t * heads + h) * d..(t * heads + h + 1) * d;
            let dst = row * d * eb..(row + 1) * d * eb;
            let ks = encode_row(shape.format, &k[src.clone()], &mut c.k[dst.clone()]);
            let vs = encode_row(shape.format, &v[src], &mut c.v[dst]);
            if has_scales(shape.format) {
                c.k_scales[row] = ks;
                c.v_scales[row] = vs;
            }
        }
    }
}

fn empty_contents(shape: KvSlabShape) -> KvSlabContents {
    let bytes = shape.elements() * shape.format.element_bytes();
    KvSlabContents {
        k: vec![0; bytes],
        v: vec![0; bytes],
        k_scales: vec![0.0; shape.scales()],
        v_scales: vec![0.0; shape.scales()],
    }
}

/// A random permutation of `0..n` (Fisher-Yates).
fn shuffled(data: &mut TestData, n: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = data.below(i + 1);
        v.swap(i, j);
    }
    v
}

/// Stores `rows` random rows (wide range of magnitudes, some all-zero rows) into scattered
/// slots and compares the backend's slab with the host encoding byte for byte.
pub fn check_kv_store_case<B: Backend>(
    b: &B,
    format: KvFormat,
    heads: usize,
    d: usize,
    rows: usize,
    seed: u64,
) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(seed);
    let shape = KvSlabShape {
        format,
        num_kv_heads: heads,
        head_dim: d,
        slots: rows * 2 + 3,
    };
    let slots: Vec<u32> = shuffled(&mut data, shape.slots)[..rows].to_vec();
    let mut k = Vec::with_capacity(rows * heads * d);
    let mut v = Vec::with_capacity(rows * heads * d);
    for r in 0..rows * heads {
        // Row scales from 1e-3 to 1e3; every 7th row is zeros (scale 0, codes 0).
        let s = if r % 7 == 3 {
            0.0
        } else {
            10f32.powf(data.uniform(-3.0, 3.0))
        };
        k.extend(data.normals(d, 1.0, act).iter().map(|x| act.round(x * s)));
        v.extend(data.normals(d, 1.0, act).iter().map(|x| act.round(x * s)));
    }
    let what = format!("kv_store {format:?} heads {heads} d {d} rows {rows}");
    let mut slab = ctx(&what, b.kv_slab(shape))?;
    let idx = ctx(&what, b.upload_index(&slots))?;
    ctx(
        &what,
        b.kv_store(&mut slab, &put(b, &k, act)?, &put(b, &v, act)?, &idx),
    )?;
    let got = ctx(&what, b.kv_slab_contents(&slab))?;
    let mut want = empty_contents(shape);
    host_store(shape, &mut want, &k, &v, &slots);
    let first_diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
    if let Some(i) = first_diff(&got.k, &want.k).or(first_diff(&got.v, &want.v)) {
        return Err(format!("{what}: byte {i} differs from the host encoding"));
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if !same(&got.k_scales, &want.k_scales) || !same(&got.v_scales, &want.v_scales) {
        return Err(format!("{what}: scales differ from the host encoding"));
    }
    if got != want {
        return Err(format!("{what}: slab sizes differ from the host layout"));
    }
    Ok(())
}

/// One paged attention call: sequences given as (cached keys, query tokens).
#[derive(Clone, Debug)]
pub struct PagedCase {
    /// The slab's format.
    pub format: KvFormat,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Sliding window ([`AttentionParams::window`]); attention is always causal here.
    pub window: Option<usize>,
    /// Score scale ([`AttentionParams::scale`]).
    pub scale: f32,
    /// Score softcap ([`AttentionParams::softcap`]).
    pub softcap: Option<f32>,
    /// Each sequence's `(cached keys, query tokens)`.
    pub seqs: Vec<(usize, usize)>,
    /// Seed of the [`TestData`] inputs (values and slot order).
    pub seed: u64,
}

/// [`check_paged_attention_case_within`] at the activation dtype's tolerance.
pub fn check_paged_attention_case<B: Backend>(b: &B, c: &PagedCase) -> CheckResult {
    check_paged_attention_case_within(b, c, Tolerance::for_dtype(b.activation_dtype()))
}

/// [`check_paged_attention_case`] at a given tolerance (a backend mode that rounds inside
/// attention, such as the CUDA backend's bf16 mode, is held to bf16's).
pub fn check_paged_attention_case_within<B: Backend>(
    b: &B,
    c: &PagedCase,
    tol: Tolerance,
) -> CheckResult {
    let what = format!("paged_attention {c:?}");
    let (out, want, mag) = run_paged_attention_case(b, c)?;
    compare(&what, &get(b, &out)?, &want, &mag, tol)
}

/// A case's output buffer, and the reference values and magnitudes.
pub type PagedRun<B> = (<B as Backend>::Buffer, Vec<f64>, Vec<f64>);

/// Runs `c` on `b`.
pub fn run_paged_attention_case<B: Backend>(b: &B, c: &PagedCase) -> Result<PagedRun<B>, String> {
    run_paged_attention_case_in(b, c, None)
}

/// [`check_paged_attention_case_within`] on a batch made as a captured step's
/// ([`Backend::paged_batch_with_capacity`], room for twice its slots): its attention splits
/// the keys without knowing how many the rows have.
pub fn check_paged_attention_graph_case_within<B: Backend>(
    b: &B,
    c: &PagedCase,
    tol: Tolerance,
) -> CheckResult {
    let what = format!("paged_attention as a captured step's {c:?}");
    let (out, want, mag) = run_paged_attention_case_in(b, c, Some(2))?;
    compare(&what, &get(b, &out)?, &want, &mag, tol)
}

/// Decode batches at the shapes whose splits a captured step caps by the window (E2B's
/// sliding layers, d 256, window 512, one KV head, at 1 and 8 rows, rows on both sides of
/// the window) or sizes by the wave alone (128 rows; E4B's two KV heads at 64; a full
/// layer, no window, at 8 rows).
pub fn paged_attention_graph_cases() -> Vec<PagedCase> {
    let sliding = PagedCase {
        format: KvFormat::Bf16,
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 256,
        window: Some(512),
        scale: 1.0,
        softcap: None,
        seqs: vec![(900, 1)],
        seed: 760,
    };
    let depths = |rows: usize, step: usize| -> Vec<(usize, usize)> {
        (0..rows).map(|i| ((step * i + 3) % 1100, 1)).collect()
    };
    vec![
        sliding.clone(),
        PagedCase {
            seqs: vec![
                (511, 1),
                (512, 1),
                (513, 1),
                (40, 1),
                (1000, 1),
                (5, 1),
                (700, 1),
                (0, 1),
            ],
            seed: 761,
            ..sliding.clone()
        },
        PagedCase {
            seqs: depths(128, 37),
            seed: 762,
            ..sliding.clone()
        },
        PagedCase {
            n_kv_heads: 2,
            seqs: depths(64, 53),
            seed: 763,
            ..sliding.clone()
        },
        PagedCase {
            head_dim: 512,
            window: None,
            seqs: depths(8, 211),
            seed: 764,
            ..sliding
        },
    ]
}

/// Verification batches: every sequence checks the same number of tokens (its newest and
/// its drafts), so the tensor-core decode kernels take a sequence's tokens in one block and
/// mask each token's keys by its own position and window, where those blocks still fill a
/// wave of the GPU with their key splits (on an H200, 264 resident d-256 blocks and 132
/// d-512 ones; a step's batch splits a windowed sequence's 512 keys in 3, a captured step's
/// in 16): so E4B's sliding layers (8 query heads over 2 KV heads, d 256, window 512) take
/// 48 sequences at 2, 3 and 4 tokens, at depths on both sides of the window's edge (each
/// token's window starts at its own position) and scattered; E2B's (one KV head: 2 tokens
/// fill the mma's 16 rows) 96 at 2 tokens; a full layer at d 512 six deep sequences (many
/// key splits, so a split can hold keys only the later tokens see); and 5 tokens of E4B,
/// more than a block holds (a block a token).
pub fn paged_attention_verification_cases() -> Vec<PagedCase> {
    let e4b = PagedCase {
        format: KvFormat::Bf16,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 256,
        window: Some(512),
        scale: 1.0,
        softcap: None,
        seqs: vec![],
        seed: 770,
    };
    let edges = [509, 510, 511, 512, 513, 900, 3, 0];
    let runs = |n: usize, q: usize| -> Vec<(usize, usize)> {
        (0..n)
            .map(|i| (edges.get(i).copied().unwrap_or((37 * i + 5) % 1100), q))
            .collect()
    };
    vec![
        PagedCase {
            seqs: runs(48, 2),
            ..e4b.clone()
        },
        PagedCase {
            seqs: runs(48, 3),
            seed: 771,
            ..e4b.clone()
        },
        PagedCase {
            seqs: runs(48, 4),
            seed: 772,
            ..e4b.clone()
        },
        PagedCase {
            n_kv_heads: 1,
            seqs: runs(96, 2),
            seed: 773,
            ..e4b.clone()
        },
        PagedCase {
            head_dim: 512,
            window: None,
            seqs: [3000, 17, 1200, 2500, 800, 2000].map(|a| (a, 4)).to_vec(),
            seed: 774,
            ..e4b.clone()
        },
        PagedCase {
            seqs: runs(48, 5),
            seed: 775,
            ..e4b
        },
    ]
}

/// Runs `c` on `b`, its batch made with room for `capacity_times` times its slots where
/// given.
fn run_paged_attention_case_in<B: Backend>(
    b: &B,
    c: &PagedCase,
    capacity_times: Option<usize>,
) -> Result<PagedRun<B>, String> {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let (d, hk) = (c.head_dim, c.n_kv_heads);
    let total_keys: usize = c.seqs.iter().map(|&(a, q)| a + q).sum();
    let shape = KvSlabShape {
        format: c.format,
        num_kv_heads: hk,
        head_dim: d,
        slots: total_keys + 5,
    };
    let perm = shuffled(&mut data, shape.slots);
    let p = AttentionParams {
        n_heads: c.n_heads,
        n_kv_heads: hk,
        head_dim: d,
        scale: c.scale,
        window: c.window,
        causal: true,
        softcap: c.softcap,
    };
    let std = (2.5f32 / (d as f32).sqrt() / c.scale.abs().max(1e-6)).sqrt();
    let what = format!("paged_attention {c:?}");
    let mut slab = ctx(&what, b.kv_slab(shape))?;
    let mut host = empty_contents(shape);
    let (mut seqs, mut slots, mut q) = (Vec::new(), Vec::new(), Vec::new());
    let (mut want, mut mag) = (Vec::new(), Vec::new());
    let mut used = 0;
    for &(cached, q_len) in &c.seqs {
        let n = cached + q_len;
        let seq_slots = &perm[used..used + n];
        used += n;
        let k = data.normals(n * hk * d, std, act);
        let v = data.normals(n * hk * d, 1.0, act);
        let idx = ctx(&what, b.upload_index(seq_slots))?;
        ctx(
            &what,
            b.kv_store(&mut slab, &put(b, &k, act)?, &put(b, &v, act)?, &idx),
        )?;
        host_store(shape, &mut host, &k, &v, seq_slots);
        // Address only the keys a window can see (as the model does), else all.
        let k_start = c.window.map_or(0, |w| cached.saturating_sub(w - 1));
        seqs.push(PagedSeq {
            q_offset: q.len() / (c.n_heads * d),
            q_len,
            q_start: cached,
            k_start,
            slot_offset: slots.len(),
        });
        slots.extend_from_slice(&seq_slots[k_start..]);
        let qs = data.normals(q_len * c.n_heads * d, std, act);
        // Reference over the dequantized rows the slab holds.
        let eb = c.format.element_bytes();
        let (mut kd, mut vd) = (
            vec![0f32; (n - k_start) * hk * d],
            vec![0f32; (n - k_start) * hk * d],
        );
        for (i, &slot) in seq_slots[k_start..].iter().enumerate() {
            for h in 0..hk {
                let row = slot as usize * hk + h;
                let (ks, vs) = if has_scales(c.format) {
                    (host.k_scales[row], host.v_scales[row])
                } else {
                    (1.0, 1.0)
                };
                let at = (i * hk + h) * d;
                let bytes = row * d * eb..(row + 1) * d * eb;
                decode_row(c.format, &host.k[bytes.clone()], ks, &mut kd[at..at + d]);
                decode_row(c.format, &host.v[bytes], vs, &mut vd[at..at + d]);
            }
        }
        let q_pos: Vec<u32> = (cached..n).map(|x| x as u32).collect();
        let k_pos: Vec<u32> = (k_start..n).map(|x| x as u32).collect();
        let (w, m) = reference::attention(&qs, &kd, &vd, &q_pos, &k_pos, &p);
        want.extend(w);
        mag.extend(m);
        q.extend(qs);
    }
    let batch = match capacity_times {
        Some(times) => b.paged_batch_with_capacity(&seqs, &slots, times * slots.len()),
        None => b.paged_batch(&seqs, &slots),
    };
    let batch = ctx(&what, batch)?;
    let mut out = ctx(&what, b.zeros(q.len(), act))?;
    ctx(
        &what,
        b.paged_attention(&put(b, &q, act)?, &slab, &batch, p, &mut out),
    )?;
    Ok((out, want, mag))
}

/// The attention cases of [`check_paged`]: every format at a small shape, then the model's
/// shapes.
pub fn paged_attention_cases() -> Vec<PagedCase> {
    let base = PagedCase {
        format: KvFormat::F32,
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 256,
        window: None,
        scale: 1.0,
        softcap: None,
        seqs: vec![(0, 7), (12, 1), (30, 4)],
        seed: 730,
    };
    let mut cases: Vec<PagedCase> = ALL_FORMATS
        .into_iter()
        .enumerate()
        .map(|(i, format)| PagedCase {
            format,
            seed: 731 + i as u64,
            ..base.clone()
        })
        .collect();
    cases.extend([
        // E2B sliding layer: window 512 over a long decode and an extend chunk.
        PagedCase {
            window: Some(512),
            seqs: vec![(700, 1), (530, 6), (3, 1)],
            seed: 740,
            ..base.clone()
        },
        // E2B full layer, d 512, long decode (several splits) beside a prefill.
        PagedCase {
            head_dim: 512,
            format: KvFormat::Bf16,
            seqs: vec![(1500, 1), (0, 20)],
            seed: 741,
            ..base.clone()
        },
        // Two decode rows, one deep enough for 17 key splits on a 132-multiprocessor GPU on
        // the exact path and 33 on the tensor-core one (the combine's loads go sixteen
        // partial rows at a time, then a tail), the other short enough that most of its
        // splits are empty.
        PagedCase {
            format: KvFormat::Bf16,
            seqs: vec![(8400, 1), (40, 1)],
            seed: 744,
            ..base.clone()
        },
        // Many decode rows at once (a large decode batch at scattered depths, a sliding
        // layer and a two-KV-head full layer): few key splits a row, most rows' splits
        // uneven.
        PagedCase {
            format: KvFormat::Bf16,
            window: Some(512),
            seqs: (0..80).map(|i| ((37 * i + 5) % 900, 1)).collect(),
            seed: 751,
            ..base.clone()
        },
        PagedCase {
            format: KvFormat::Bf16,
            n_kv_heads: 2,
            seqs: (0..40).map(|i| ((53 * i + 11) % 700, 1)).collect(),
            seed: 752,
            ..base.clone()
        },
        // E4B: 8 query heads over 2 KV heads, int8 and fp8.
        PagedCase {
            n_kv_heads: 2,
            head_dim: 512,
            format: KvFormat::Int8PerTokenHead,
            seqs: vec![(900, 1), (40, 3)],
            seed: 742,
            ..base.clone()
        },
        PagedCase {
            n_kv_heads: 2,
            format: KvFormat::Fp8E4m3PerTokenHead,
            window: Some(512),
            seqs: vec![(600, 1)],
            seed: 743,
            ..base.clone()
        },
        // Sixteen query heads on one KV head (a group too large for one block of warps).
        PagedCase {
            n_heads: 16,
            head_dim: 128,
            scale: 1.0 / 128f32.sqrt(),
            seqs: vec![(300, 1), (7, 5)],
            seed: 746,
            ..base.clone()
        },
        // Llama / Qwen shapes with 1/sqrt(d); a softcap; window shorter than the chunk.
        PagedCase {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 0.125,
            window: Some(3),
            seqs: vec![(5, 9), (0, 1)],
            seed: 744,
            ..base.clone()
        },
        PagedCase {
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 128,
            scale: 1.0 / 128f32.sqrt(),
            softcap: Some(50.0),
            seqs: vec![(33, 2)],
            seed: 745,
            ..base.clone()
        },
        // Long query runs (prefill chunks, which a device backend may attend with GEMMs)
        // beside short ones: a full layer with a cached prefix, a window shorter than the
        // chunk (several query tiles), 8:2 GQA with int8 KV, and a softcap.
        PagedCase {
            head_dim: 512,
            format: KvFormat::Bf16,
            seqs: vec![(0, 300), (100, 70), (50, 1)],
            seed: 747,
            ..base.clone()
        },
        PagedCase {
            window: Some(64),
            seqs: vec![(0, 200), (37, 90)],
            seed: 748,
            ..base.clone()
        },
        PagedCase {
            n_kv_heads: 2,
            format: KvFormat::Int8PerTokenHead,
            window: Some(512),
            seqs: vec![(600, 100)],
            seed: 749,
            ..base.clone()
        },
        PagedCase {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 0.125,
            softcap: Some(50.0),
            window: Some(7),
            seqs: vec![(10, 65), (0, 64)],
            seed: 750,
            ..base.clone()
        },
    ]);
    cases
}

/// Every format at small shapes, then the model's shapes: Gemma-4 E2B sliding (d 256,
/// window 512) and full (d 512) layers with one KV head under eight query heads, E4B's
/// two KV heads, a mixed batch of prefill chunks and decode rows, long decode (split-K),
/// and Llama-style d 64/128 with a softcap.
pub fn check_paged<B: Backend>(b: &B) -> CheckResult {
    for (i, format) in ALL_FORMATS.into_iter().enumerate() {
        check_kv_store_case(b, format, 1, 256, 9, 700 + i as u64)?;
        check_kv_store_case(b, format, 2, 512, 5, 710 + i as u64)?;
        check_kv_store_case(b, format, 4, 64, 17, 720 + i as u64)?;
    }
    for c in &paged_attention_cases() {
        check_paged_attention_case(b, c)?;
    }
    let tol = Tolerance::for_dtype(b.activation_dtype());
    for c in &paged_attention_graph_cases() {
        check_paged_attention_graph_case_within(b, c, tol)?;
    }
    for c in &paged_attention_verification_cases() {
        check_paged_attention_case(b, c)?;
        check_paged_attention_graph_case_within(b, c, tol)?;
    }
    // A batch whose slots run past the slab is refused, not read.
    let shape = KvSlabShape {
        format: KvFormat::F32,
        num_kv_heads: 1,
        head_dim: 64,
        slots: 4,
    };
    let slab = ctx("paged bounds", b.kv_slab(shape))?;
    let seq = PagedSeq {
        q_offset: 0,
        q_len: 1,
        q_start: 1,
        k_start: 0,
        slot_offset: 0,
    };
    let batch = ctx("paged bounds", b.paged_batch(&[seq], &[0, 9]))?;
    let q = put(b, &vec![0.5; 64], b.activation_dtype())?;
    let mut out = put(b, &vec![0.0; 64], b.activation_dtype())?;
    let p = AttentionParams {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 64,
        scale: 1.0,
        window: None,
        causal: true,
        softcap: None,
    };
    if b.paged_attention(&q, &slab, &batch, p, &mut out).is_ok() {
        return Err("paged_attention read slot 9 of a 4-slot slab".into());
    }
    if b.paged_batch(&[seq], &[0]).is_ok() {
        return Err("paged_batch accepted a sequence reading past its slot table".into());
    }
    check_update_by_pages(b)
}

/// An F32 slab of one KV head (`head_dim` `d`) with random keys and values in all `slots`
/// slots, for checks that read the same keys two ways.
pub(super) fn random_slab<B: Backend>(
    b: &B,
    data: &mut TestData,
    what: &str,
    slots: usize,
    d: usize,
) -> Result<B::KvSlab, String> {
    let act = b.activation_dtype();
    let shape = KvSlabShape {
        format: KvFormat::F32,
        num_kv_heads: 1,
        head_dim: d,
        slots,
    };
    let mut slab = ctx(what, b.kv_slab(shape))?;
    let all: Vec<u32> = (0..slots as u32).collect();
    let k = data.normals(slots * d, 0.3, act);
    let v = data.normals(slots * d, 1.0, act);
    let idx = ctx(what, b.upload_index(&all))?;
    ctx(
        what,
        b.kv_store(&mut slab, &put(b, &k, act)?, &put(b, &v, act)?, &idx),
    )?;
    Ok(slab)
}

/// A graph batch rewritten by pages ([`Backend::paged_batch_update_pages`]) attends exactly
/// as one made from the slots they expand to ([`crate::expand_page_slots`]): decode rows
/// over scattered pages with and without a window, a multi-row chunk, and a pad row on the
/// page past the slab's last (the decode graph's spare slot). Malformed page lists are
/// refused.
fn check_update_by_pages<B: Backend>(b: &B) -> CheckResult {
    const WHAT: &str = "paged_batch_update_pages";
    let (ps, n_pages, d) = (16usize, 48usize, 64usize);
    let act = b.activation_dtype();
    let mut data = TestData::new(760);
    let slab = random_slab(b, &mut data, WHAT, n_pages * ps + 1, d)?;
    // (cached keys, query rows, window) a sequence; its pages drawn from a shuffled list.
    let shapes = [
        (100, 1, None),
        (37, 1, Some(20)),
        (0, 1, None),
        (60, 5, Some(32)),
        (15, 1, None),
    ];
    let order = shuffled(&mut data, n_pages);
    let (mut seqs, mut pages, mut page_start) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rows, mut keys, mut next) = (0, 0, 0);
    for &(cached, q_len, window) in &shapes {
        let end: usize = cached + q_len;
        let k_start = window.map_or(0, |w: usize| cached.saturating_sub(w - 1));
        seqs.push(PagedSeq {
            q_offset: rows,
            q_len,
            q_start: cached,
            k_start,
            slot_offset: keys,
        });
        page_start.push(pages.len() as u32);
        for _ in k_start / ps..end.div_ceil(ps) {
            pages.push(order[next]);
            next += 1;
        }
        rows += q_len;
        keys += end - k_start;
    }
    // A pad row: one key at position 0 of the page past the last (slot n_pages * ps).
    seqs.push(PagedSeq {
        q_offset: rows,
        q_len: 1,
        q_start: 0,
        k_start: 0,
        slot_offset: keys,
    });
    page_start.push(pages.len() as u32);
    pages.push(n_pages as u32);
    rows += 1;
    let slots = ctx(
        WHAT,
        crate::expand_page_slots(&seqs, &pages, &page_start, ps),
    )?;
    let p = AttentionParams {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: d,
        scale: 0.125,
        window: None,
        causal: true,
        softcap: None,
    };
    let q = put(b, &data.normals(rows * 2 * d, 1.0, act), act)?;
    let capacity = 4 * slots.len();
    let by_slots = ctx(WHAT, b.paged_batch_with_capacity(&seqs, &slots, capacity))?;
    let mut want = ctx(WHAT, b.zeros(rows * 2 * d, act))?;
    ctx(WHAT, b.paged_attention(&q, &slab, &by_slots, p, &mut want))?;
    // Made with other slots, then rewritten by pages.
    let mut by_pages = ctx(
        WHAT,
        b.paged_batch_with_capacity(&seqs, &vec![0; slots.len()], capacity),
    )?;
    ctx(
        WHAT,
        b.paged_batch_update_pages(&mut by_pages, &seqs, &pages, &page_start, ps),
    )?;
    let mut got = ctx(WHAT, b.zeros(rows * 2 * d, act))?;
    ctx(WHAT, b.paged_attention(&q, &slab, &by_pages, p, &mut got))?;
    let (got, want) = (get(b, &got)?, get(b, &want)?);
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        return Err(format!(
            "{WHAT}: value {i} is {} by pages, {} by slots",
            got[i], want[i]
        ));
    }
    let short = &pages[..pages.len() - 1];
    if b.paged_batch_update_pages(&mut by_pages, &seqs, short, &page_start, ps)
        .is_ok()
    {
        return Err(format!("{WHAT} accepted a sequence reading past its pages"));
    }
    if b.paged_batch_update_pages(&mut by_pages, &seqs, &pages, &page_start[1..], ps)
        .is_ok()
    {
        return Err(format!(
            "{WHAT} accepted a page start short of the sequences"
        ));
    }
    Ok(())
}
