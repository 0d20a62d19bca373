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

#[test]
fn vision_tower_matches_transformers_on_two_image_sizes() {
    let tower = VisionTower::load(&fixture())
        .unwrap()
        .expect("a vision tower");
    let bytes = std::fs::read(fixture().join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let text = tower.config().text_hidden_size;
    for (i, want_tokens) in [(0, 12), (1, 6)] {
        let positions: Vec<[i64; 2]> = st
            .tensor(&format!("position_ids_{i}"))
            .unwrap()
            .data()
            .chunks_exact(16)
            .map(|c| {
                [
                    i64::from_le_bytes(c[..8].try_into().unwrap()),
                    i64::from_le_bytes(c[8..].try_into().unwrap()),
                ]
            })
            .collect();
        let out = tower
            .encode(&f32s(&format!("pixel_values_{i}")), &positions)
            .unwrap();
        assert_eq!(out.tokens, want_tokens, "image {i}");
        assert_eq!(out.soft_tokens.len(), want_tokens * text);
        for (name, got) in [
            ("encoder", &out.encoder),
            ("vision", &out.vision),
            ("soft_tokens", &out.soft_tokens),
        ] {
            let want = f32s(&format!("{name}_{i}"));
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
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let i64s = |name: &str| -> Vec<i64> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let ids: Vec<u32> = i64s("prompt_ids").iter().map(|&v| v as u32).collect();
    // Each image's soft tokens, from the tower.
    let soft: Vec<Vec<f32>> = (0..2)
        .map(|i| {
            let pos: Vec<[i64; 2]> = i64s(&format!("position_ids_{i}"))
                .chunks_exact(2)
                .map(|p| [p[0], p[1]])
                .collect();
            tower
                .encode(&f32s(&format!("pixel_values_{i}")), &pos)
                .unwrap()
                .soft_tokens
        })
        .collect();
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
    let want = f32s("prompt_logits");
    let d = max_abs_diff(&logits, &want);
    eprintln!("multimodal prompt logits: max abs diff {d:.2e}");
    assert!(d < 1e-4, "off by {d}");
}
