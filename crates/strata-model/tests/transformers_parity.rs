//! CPU f32 logits against transformers on tiny random models (fixtures made by
//! `scripts/reference/make_tiny_fixtures.py`, see `tests/fixtures/tiny/README.md`).

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{ForwardBatch, KvCache, LogitsMode, Model, PagedStorage, SeqChunk};

struct Reference {
    ids: Vec<u32>,
    vocab: usize,
    logits: Vec<f32>,
    decode_logits: Vec<f32>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

fn reference(dir: &Path) -> Reference {
    let bytes = std::fs::read(dir.join("reference.safetensors")).expect("reference.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> (Vec<f32>, Vec<usize>) {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        (
            t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            t.shape().to_vec(),
        )
    };
    let ids_t = st.tensor("input_ids").unwrap();
    let ids: Vec<u32> = match ids_t.dtype() {
        safetensors::Dtype::I64 => ids_t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        safetensors::Dtype::I32 => ids_t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        other => panic!("input_ids dtype {other:?}"),
    };
    let (logits, shape) = f32s("logits");
    let vocab = *shape.last().unwrap();
    let (decode_logits, _) = f32s("decode_logits");
    Reference {
        ids,
        vocab,
        logits,
        decode_logits,
    }
}

/// A pool of `storage` with room for the fixtures' sequences (pages of 4 tokens).
fn pool_of<S: KvStorage>(model: &Model<CpuBackend>, dtype: KvCacheDtype, storage: S) -> KvPool<S> {
    let layout = KvLayout::for_config(model.config(), dtype).unwrap();
    let plan = PagePlan {
        full: 64,
        window: 64,
        page_size: 4,
    };
    KvPool::new(layout, plan, CacheType::Naive, storage).unwrap()
}

fn pool(model: &Model<CpuBackend>, dtype: KvCacheDtype) -> KvPool<HostStorage> {
    pool_of(model, dtype, HostStorage::new())
}

/// The device-style pool (`PagedStorage`) on the CPU backend.
fn paged_pool(model: &Model<CpuBackend>, dtype: KvCacheDtype) -> KvPool<PagedStorage<CpuBackend>> {
    pool_of(model, dtype, PagedStorage::new(CpuBackend::new()))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `ids` through the model in chunks of the given sizes, returning every position's
/// logits.
fn run_chunked<S: KvStorage>(
    model: &Model<CpuBackend>,
    kv: &mut KvPool<S>,
    ids: &[u32],
    chunks: &[usize],
) -> Vec<f32>
where
    KvPool<S>: KvCache<CpuBackend>,
{
    let req = kv.alloc_request();
    let mut out = Vec::new();
    let mut start = 0;
    for &n in chunks {
        kv.extend(req, n).unwrap();
        let batch = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![SeqChunk {
                request: req,
                tokens: ids[start..start + n].to_vec(),
                start,
                logits: LogitsMode::All,
            }],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        out.extend(model.forward(kv, &batch).unwrap().logits.remove(0));
        start += n;
    }
    kv.release(req).unwrap();
    out
}

fn check(name: &str) {
    let dir = fixture(name);
    let r = reference(&dir);
    let model = Model::load(CpuBackend::new(), &dir).unwrap();
    let n = r.ids.len();
    let mut kv = pool(&model, KvCacheDtype::F32);

    let full = run_chunked(&model, &mut kv, &r.ids, &[n]);
    let d = max_abs_diff(&full, &r.logits);
    assert!(
        d < 1e-4,
        "{name}: one-pass prefill differs from transformers by {d}"
    );

    // Chunked prefill: chunk edges inside and across the sliding window.
    let chunked = run_chunked(&model, &mut kv, &r.ids, &[7, 3, n - 10]);
    let d = max_abs_diff(&chunked, &r.logits);
    assert!(d < 1e-4, "{name}: chunked prefill differs by {d}");

    // Prefill then token-by-token decode, compared with transformers' cached decode.
    let steps = r.decode_logits.len() / r.vocab;
    let prefill = n - steps;
    let mut sizes = vec![prefill];
    sizes.extend(std::iter::repeat_n(1, steps));
    let stepwise = run_chunked(&model, &mut kv, &r.ids, &sizes);
    let d = max_abs_diff(&stepwise[prefill * r.vocab..], &r.decode_logits);
    assert!(d < 1e-4, "{name}: step decode differs by {d}");
}

#[test]
fn gemma4_tiny() {
    check("gemma4-tiny");
}

#[test]
fn gemma4_tiny_multimodal_layout() {
    check("gemma4-tiny-mm");
}

#[test]
fn gemma3_tiny() {
    check("gemma3-tiny");
}

#[test]
fn llama_tiny() {
    check("llama-tiny");
}

#[test]
fn qwen3_tiny() {
    check("qwen3-tiny");
}

/// Quantized KV formats: the same teacher-forced comparison (prefill, then six decode steps)
/// with stated bounds on the max |logit difference| (logits of these models span about +-3).
/// The tiny Gemma-4 is an order of magnitude more sensitive to any KV rounding than the
/// others, f16 included, because its attention scale is 1.0 with random q/k norm weights:
/// scores are large and softmax sharp. Its bounds scale with that measured sensitivity
/// (bf16 0.14 vs 0.01 for the others).
fn check_quantized_kv(name: &str, dtype: KvCacheDtype, bound: f32) {
    let dir = fixture(name);
    let r = reference(&dir);
    let model = Model::load(CpuBackend::new(), &dir).unwrap();
    let mut kv = pool(&model, dtype);
    let n = r.ids.len();
    let out = run_chunked(&model, &mut kv, &r.ids, &[n - 6, 1, 1, 1, 1, 1, 1]);
    let d = max_abs_diff(&out, &r.logits);
    assert!(d < bound, "{name} {dtype}: max |diff| {d} >= {bound}");
    assert!(
        d > 0.0,
        "{name} {dtype}: a rounded KV format cannot be exact"
    );
}

#[test]
fn quantized_kv_within_bounds() {
    // (model, bf16, int8, fp8) bounds.
    let cases = [
        ("gemma4-tiny", 0.3, 0.7, 2.0),
        ("gemma3-tiny", 0.03, 0.08, 0.4),
        ("llama-tiny", 0.03, 0.08, 0.4),
        ("qwen3-tiny", 0.03, 0.08, 0.4),
    ];
    for (name, bf16, int8, fp8) in cases {
        check_quantized_kv(name, KvCacheDtype::Bf16, bf16);
        check_quantized_kv(name, KvCacheDtype::Int8PerTokenHead, int8);
        check_quantized_kv(name, KvCacheDtype::Fp8PerTokenHead, fp8);
    }
}

/// The device-style pool (`PagedStorage`: slabs owned by the backend, `kv_store` and
/// `paged_attention` through per-step slot tables) gives bit-for-bit the logits of the host
/// pool on the CPU backend, for every fixture and KV format, over prefill, chunked prefill
/// across the window and decode with two sequences interleaved in one batch.
/// Weights quantized to Q8_0 at load (`LoadOptions::quantize`) against transformers' f32
/// logits: not bit-exact (the matrices did change), the same top token wherever
/// transformers' margin is at least 0.5, and a max difference within 8 times that of the
/// same model with its weights merely rounded to bf16 (Q8_0 keeps about 7 bits a weight
/// and the CPU's products also round activations to 8 bits; the tiny Gemma-4, which scales
/// no attention logits, amplifies both alike).
#[test]
fn weights_quantized_at_load_stay_close_to_transformers() {
    let load = |dir: &Path, opts| Model::load_with(CpuBackend::new(), dir, opts).unwrap();
    let q8 = strata_model::LoadOptions {
        quantize: Some(strata_weights::GgmlType::Q8_0),
        ..Default::default()
    };
    let bf16 = strata_model::LoadOptions {
        weight_dtype: Some(strata_kernels::DType::BF16),
        ..Default::default()
    };
    let mut decisive = 0;
    for name in ["gemma3-tiny", "gemma4-tiny", "llama-tiny", "qwen3-tiny"] {
        let dir = fixture(name);
        let r = reference(&dir);
        let n = r.ids.len();
        let chunks = [n - 3, 1, 1, 1];
        let logits = |opts| {
            let model = load(&dir, opts);
            let mut kv = pool(&model, KvCacheDtype::F32);
            run_chunked(&model, &mut kv, &r.ids, &chunks)
        };
        let (out, rounded) = (logits(q8.clone()), logits(bf16.clone()));
        let (d, d_bf16) = (
            max_abs_diff(&out, &r.logits),
            max_abs_diff(&rounded, &r.logits),
        );
        eprintln!("{name}: max |diff| Q8_0 at load {d:.3e}, bf16 weights {d_bf16:.3e}");
        assert!(d > 0.0 && d < 8.0 * d_bf16, "{name}: Q8_0 max |diff| {d}");
        for (p, (got, want)) in out
            .chunks(r.vocab)
            .zip(r.logits.chunks(r.vocab))
            .enumerate()
        {
            let mut order: Vec<usize> = (0..r.vocab).collect();
            order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
            if want[order[0]] - want[order[1]] < 0.5 {
                continue;
            }
            decisive += 1;
            let top = (0..r.vocab)
                .max_by(|&a, &b| got[a].total_cmp(&got[b]))
                .unwrap();
            assert_eq!(top, order[0], "{name}: position {p}");
        }
    }
    assert!(decisive > 0, "no decisive position in any fixture");
}

#[test]
fn paged_storage_equals_host_storage() {
    for name in [
        "gemma4-tiny",
        "gemma4-tiny-mm",
        "gemma3-tiny",
        "llama-tiny",
        "qwen3-tiny",
    ] {
        let dir = fixture(name);
        let r = reference(&dir);
        let model = Model::load(CpuBackend::new(), &dir).unwrap();
        let n = r.ids.len();
        for dtype in [
            KvCacheDtype::F32,
            KvCacheDtype::Bf16,
            KvCacheDtype::Fp8PerTokenHead,
            KvCacheDtype::Int8PerTokenHead,
        ] {
            let mut paged = paged_pool(&model, dtype);
            let chunks = [7, 3, n - 16, 1, 1, 1, 1, 1, 1];
            let got = run_chunked(&model, &mut paged, &r.ids, &chunks);
            let want = run_chunked(&model, &mut pool(&model, dtype), &r.ids, &chunks);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {dtype}: paged storage differs from host storage by {}",
                max_abs_diff(&got, &want)
            );
            if dtype == KvCacheDtype::F32 {
                let d = max_abs_diff(&got, &r.logits);
                assert!(
                    d < 1e-4,
                    "{name}: paged storage differs from transformers by {d}"
                );
            }
            // Two sequences in one batch, each chunk aligned with its own solo run.
            let (a, b) = (paged.alloc_request(), paged.alloc_request());
            let half = n / 2;
            paged.extend(a, half).unwrap();
            paged.extend(b, n).unwrap();
            let batch = ForwardBatch {
                embeds: Vec::new(),
                seqs: vec![
                    SeqChunk {
                        request: a,
                        tokens: r.ids[..half].to_vec(),
                        start: 0,
                        logits: LogitsMode::All,
                    },
                    SeqChunk {
                        request: b,
                        tokens: r.ids.clone(),
                        start: 0,
                        logits: LogitsMode::All,
                    },
                ],
                adjust: Vec::new(),
                masked: Vec::new(),
                adapters: Vec::new(),
            };
            let out = model.forward(&mut paged, &batch).unwrap();
            let solo = run_chunked(&model, &mut pool(&model, dtype), &r.ids, &[n]);
            let solo_half = run_chunked(&model, &mut pool(&model, dtype), &r.ids[..half], &[half]);
            assert_eq!(
                out.logits[1], solo,
                "{name} {dtype}: batched sequence differs"
            );
            assert_eq!(
                out.logits[0], solo_half,
                "{name} {dtype}: batched sequence differs"
            );
        }
    }
}

/// A mixed step as the scheduler makes them, then a second one, on `kv`: request a decodes
/// position 10 (prefilled to 10 before), b prefills 12 tokens wanting no logits, c
/// prefills 9 wanting its last; then b decodes position 12 and c prefills the rest wanting
/// only its greedy token. The wanted rows' logits (positions 10, 8 and 12) and c's token.
fn mixed_steps<S: KvStorage>(
    model: &Model<CpuBackend>,
    kv: &mut KvPool<S>,
    ids: &[u32],
) -> (Vec<Vec<f32>>, u32)
where
    KvPool<S>: KvCache<CpuBackend>,
{
    let n = ids.len();
    let chunk = |request, start: usize, end: usize, logits| SeqChunk {
        request,
        tokens: ids[start..end].to_vec(),
        start,
        logits,
    };
    let (a, b, c) = (kv.alloc_request(), kv.alloc_request(), kv.alloc_request());
    kv.extend(a, 11).unwrap();
    let first = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![chunk(a, 0, 10, LogitsMode::None)],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    assert!(model.forward(kv, &first).unwrap().logits[0].is_empty());
    kv.extend(b, 13).unwrap();
    kv.extend(c, n).unwrap();
    let mixed = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![
            chunk(a, 10, 11, LogitsMode::Last),
            chunk(b, 0, 12, LogitsMode::None),
            chunk(c, 0, 9, LogitsMode::Last),
        ],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    let mut out = model.forward(kv, &mixed).unwrap().logits;
    assert!(out[1].is_empty(), "a chunk wanting no logits got some");
    let next = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![
            chunk(b, 12, 13, LogitsMode::Last),
            chunk(c, 9, n, LogitsMode::Argmax),
        ],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    let more = model.forward(kv, &next).unwrap();
    for r in [a, b, c] {
        kv.release(r).unwrap();
    }
    let rows = vec![out.remove(0), out.remove(1), more.logits[0].clone()];
    (
        rows,
        more.token(1).expect("an Argmax sequence gets its token"),
    )
}

/// Gemma-4's KV-shared layers run only the rows whose logits are wanted (a prompt's last,
/// none for a chunk that wants none; `Model::set_kv_shared_trim`). Mixed steps of
/// decode rows and prompt chunks, on the host and the paged pool, give the bits of
/// every-row scoring (which runs every row through every layer) at the wanted
/// positions, with trimming on and off, and agree with transformers; a sequence that wants
/// only its greedy token gets the every-row run's. Request b's decode step reads the K/V
/// its prompt stored in a step whose shared layers skipped it.
#[test]
fn kv_shared_layers_run_only_the_wanted_rows() {
    for name in ["gemma4-tiny", "gemma4-tiny-mm"] {
        let dir = fixture(name);
        let r = reference(&dir);
        let mut model = Model::load(CpuBackend::new(), &dir).unwrap();
        let (n, v) = (r.ids.len(), r.vocab);
        let every = run_chunked(&model, &mut pool(&model, KvCacheDtype::F32), &r.ids, &[n]);
        let positions = [10, 8, 12];
        // The greedy token at the last position: the lowest id among the largest logits.
        let last = &every[(n - 1) * v..n * v];
        let greedy = (0..v).fold(0, |b, i| if last[i] > last[b] { i } else { b }) as u32;
        for trim in [true, false] {
            model.set_kv_shared_trim(trim);
            let mut paged = paged_pool(&model, KvCacheDtype::F32);
            let on_host = mixed_steps(&model, &mut pool(&model, KvCacheDtype::F32), &r.ids);
            let on_paged = mixed_steps(&model, &mut paged, &r.ids);
            for (pool_name, (got, token)) in [("host", on_host), ("paged", on_paged)] {
                assert_eq!(
                    token, greedy,
                    "{name} {pool_name} trim {trim}: greedy token"
                );
                for (row, &p) in got.iter().zip(&positions) {
                    let want = &every[p * v..(p + 1) * v];
                    assert!(
                        row.iter()
                            .zip(want)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{name} {pool_name} trim {trim}: position {p} differs from every-row \
                         scoring by {}",
                        max_abs_diff(row, want)
                    );
                    let d = max_abs_diff(row, &r.logits[p * v..(p + 1) * v]);
                    assert!(d < 1e-4, "{name} position {p}: {d} from transformers");
                }
            }
        }
    }
}
