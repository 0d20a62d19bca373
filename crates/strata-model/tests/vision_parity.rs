//! Gemma-4's vision tower against transformers: two images of different sizes (the second
//! padded to the first's patch count) through the tiny tower of
//! tests/fixtures/tiny/gemma4-tiny-vision (scripts/reference/make_vision_fixture.py): the
//! encoder's output, the pooled and standardized output, and the soft tokens, within 1e-4.

use std::path::{Path, PathBuf};

use strata_model::VisionTower;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gemma4-tiny-vision")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The fixture's `reference.safetensors`.
struct Reference(Vec<u8>);

impl Reference {
    fn load() -> Self {
        Self(std::fs::read(fixture().join("reference.safetensors")).unwrap())
    }

    fn bytes(&self, name: &str) -> Vec<u8> {
        let st = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        st.tensor(name).unwrap().data().to_vec()
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.bytes(name)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn i64s(&self, name: &str) -> Vec<i64> {
        self.bytes(name)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Image `i`'s patch positions.
    fn positions(&self, i: usize) -> Vec<[i64; 2]> {
        self.i64s(&format!("position_ids_{i}"))
            .chunks_exact(2)
            .map(|p| [p[0], p[1]])
            .collect()
    }

    /// The prompt's ids (`name`: `prompt_ids`, `prompt_greedy`).
    fn ids(&self, name: &str) -> Vec<u32> {
        self.i64s(name).iter().map(|&v| v as u32).collect()
    }

    /// Image `i` through `tower`.
    fn encode(&self, tower: &VisionTower, i: usize) -> strata_model::EncodedImage {
        tower
            .encode(&self.f32s(&format!("pixel_values_{i}")), &self.positions(i))
            .unwrap()
    }
}

#[test]
fn vision_tower_matches_transformers_on_two_image_sizes() {
    let tower = VisionTower::load(&fixture())
        .unwrap()
        .expect("a vision tower");
    let r = Reference::load();
    let text = tower.config().text_hidden_size;
    for (i, want_tokens) in [(0, 12), (1, 6)] {
        let out = r.encode(&tower, i);
        assert_eq!(out.tokens, want_tokens, "image {i}");
        assert_eq!(out.soft_tokens.len(), want_tokens * text);
        for (name, got) in [
            ("encoder", &out.encoder),
            ("vision", &out.vision),
            ("soft_tokens", &out.soft_tokens),
        ] {
            let want = r.f32s(&format!("{name}_{i}"));
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = max_abs_diff(got, &want);
            eprintln!("image {i} {name}: max abs diff {d:.2e} (largest value {scale:.2})");
            // f32 rounding, relative to the values' size (the pooled output is scaled by
            // sqrt(hidden) and the standardizing scale).
            assert!(d < 1e-5 * scale.max(10.0), "image {i} {name}: off by {d}");
        }
    }
}

#[test]
fn patches_that_do_not_fit_the_tower_are_refused() {
    let tower = VisionTower::load(&fixture()).unwrap().unwrap();
    let patch = 3 * tower.config().patch_size.pow(2);
    // Six patches are not a whole number of 2x2 pooling blocks.
    let pos: Vec<[i64; 2]> = (0..6).map(|i| [i % 3, i / 3]).collect();
    let err = tower.encode(&vec![0.5; 6 * patch], &pos).unwrap_err();
    assert!(err.to_string().contains("pooling"), "{err}");
    // A position past the table.
    let pos: Vec<[i64; 2]> = (0..4).map(|i| [i % 2, 1000 + i / 2]).collect();
    let err = tower.encode(&vec![0.5; 4 * patch], &pos).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    // Pixels that do not match the patch count.
    let pos: Vec<[i64; 2]> = (0..4).map(|i| [i % 2, i / 2]).collect();
    assert!(tower.encode(&[0.5; 7], &pos).is_err());
}

#[test]
fn a_text_only_checkpoint_has_no_tower() {
    let dir = fixture().join("../gemma4-tiny");
    assert!(VisionTower::load(&dir).unwrap().is_none());
}

/// The whole multimodal model: a prompt whose two runs of placeholders are given as the
/// images' soft tokens (`ForwardBatch::embeds`), in two prefill chunks that cut the first
/// image, against transformers' `Gemma4ForConditionalGeneration` on the same ids and pixels.
#[test]
fn a_prompt_with_two_images_gives_transformers_logits() {
    use std::sync::Arc;
    use strata_kernels::cpu::CpuBackend;
    use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
    use strata_model::{ForwardBatch, LogitsMode, Model, SeqChunk};
    use strata_types::RowEmbeds;

    let dir = fixture();
    let tower = VisionTower::load(&dir).unwrap().unwrap();
    let model = Model::load(CpuBackend::new(), &dir).unwrap();
    let r = Reference::load();
    let ids = r.ids("prompt_ids");
    // Each image's soft tokens, from the tower.
    let soft: Vec<Vec<f32>> = (0..2).map(|i| r.encode(&tower, i).soft_tokens).collect();
    // The placeholder runs (id 500), in order.
    let mut runs = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] == 500 {
            let start = i;
            while i < ids.len() && ids[i] == 500 {
                i += 1;
            }
            runs.push(start..i);
        } else {
            i += 1;
        }
    }
    assert_eq!(runs.len(), 2);
    let h = model.config().hidden_size;
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: 16,
        window: 16,
        page_size: 4,
    };
    let mut kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new()).unwrap();
    let req = kv.alloc_request();
    // Two chunks, the first ending inside the first image.
    let cut = runs[0].start + 5;
    let mut logits = Vec::new();
    for (start, end) in [(0, cut), (cut, ids.len())] {
        kv.extend(req, end - start).unwrap();
        let mut embeds = Vec::new();
        for (run, values) in runs.iter().zip(&soft) {
            let (a, b) = (run.start.max(start), run.end.min(end));
            if a < b {
                let from = (a - run.start) * h;
                embeds.push(RowEmbeds {
                    seq: 0,
                    first: a - start,
                    values: Arc::from(&values[from..from + (b - a) * h]),
                });
            }
        }
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                request: req,
                tokens: ids[start..end].to_vec(),
                start,
                logits: LogitsMode::All,
            }],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
            embeds,
        };
        logits.extend(model.forward(&mut kv, &batch).unwrap().logits.remove(0));
    }
    let want = r.f32s("prompt_logits");
    let d = max_abs_diff(&logits, &want);
    eprintln!("multimodal prompt logits: max abs diff {d:.2e}");
    assert!(d < 1e-4, "off by {d}");
}

/// Through the scheduler: a request whose two placeholder runs carry the images' soft
/// tokens (`Request::media`), prefilled in chunks of 4, generates transformers' greedy
/// tokens; the same prompt again reuses the cached images' K/V, and the prompt with the
/// images swapped reuses nothing past the first image.
#[test]
fn the_scheduler_generates_transformers_tokens_for_a_prompt_with_images() {
    use std::sync::Arc;
    use strata_kernels::cpu::CpuBackend;
    use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
    use strata_model::{Model, ModelRunner};
    use strata_sched::{EventKind, MediaInput, Request, Scheduler, SchedulerConfig};

    let dir = fixture();
    let tower = VisionTower::load(&dir).unwrap().unwrap();
    let model = Model::load(CpuBackend::new(), &dir).unwrap();
    let r = Reference::load();
    let ids = r.ids("prompt_ids");
    let want = r.ids("prompt_greedy");
    let soft: Vec<Arc<[f32]>> = (0..2)
        .map(|i| Arc::from(r.encode(&tower, i).soft_tokens))
        .collect();
    let starts: Vec<usize> = (1..ids.len())
        .filter(|&i| ids[i] == 500 && ids[i - 1] != 500)
        .collect();
    let h = model.config().hidden_size;
    let media = |order: [usize; 2]| -> Vec<MediaInput> {
        // The runs keep their lengths; with the images swapped, the first run holds the
        // second image's first rows padded out by its own rows again (another image).
        starts
            .iter()
            .zip(order)
            .enumerate()
            .map(|(k, (&start, img))| {
                let rows = soft[k].len() / h;
                let values: Vec<f32> = soft[img].iter().cycle().take(rows * h).copied().collect();
                MediaInput {
                    start,
                    rows,
                    values: Arc::from(values),
                    hash: (img as u64 + 1) * 0x1234_5678_9ABC_DEF1,
                }
            })
            .collect()
    };
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: 64,
        window: 64,
        page_size: 4,
    };
    let pool = KvPool::new(layout, plan, CacheType::Radix, HostStorage::new()).unwrap();
    let config = SchedulerConfig {
        prefill_chunk: 4,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(ModelRunner(model), pool, config).unwrap();
    let mut run = |order: [usize; 2]| -> (Vec<u32>, usize) {
        let mut req = Request::new(ids.clone(), want.len());
        req.ignore_eos = true;
        req.media = media(order);
        let id = sched.submit(req);
        let (mut tokens, mut cached) = (Vec::new(), 0);
        while sched.has_work() {
            for e in sched.step() {
                assert_eq!(e.id, id);
                match e.kind {
                    EventKind::Token { token, .. } => tokens.push(token),
                    EventKind::Finished { cached_tokens, .. } => cached = cached_tokens,
                    _ => {}
                }
            }
        }
        (tokens, cached)
    };
    let (first, _) = run([0, 1]);
    assert_eq!(first, want, "greedy tokens against transformers' generate");
    let (again, cached) = run([0, 1]);
    assert_eq!(again, want);
    assert!(
        cached > starts[1],
        "the images' K/V was reused: {cached} tokens"
    );
    let (_, cached) = run([1, 0]);
    assert!(
        cached <= starts[0],
        "another image reused {cached} cached tokens"
    );
    // Media past the prompt is refused when the request is admitted.
    let mut bad = Request::new(ids.clone(), 2);
    bad.media = media([0, 1]);
    bad.media[1].start = ids.len() - 2;
    let id = sched.submit(bad);
    let mut reason = None;
    while sched.has_work() {
        for e in sched.step() {
            if let (true, EventKind::Finished { reason: r, .. }) = (e.id == id, e.kind) {
                reason = Some(r);
            }
        }
    }
    match reason {
        Some(strata_sched::FinishReason::Error(msg)) => assert!(msg.contains("media"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
