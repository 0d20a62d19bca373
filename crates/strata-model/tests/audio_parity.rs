//! Gemma-4's audio tower against transformers: two clips of log-mel frames (37 and 50) through
//! the tiny conformer of tests/fixtures/tiny/gemma4-tiny-audio
//! (scripts/reference/make_audio_fixture.py: clamps and gradient clipping that bite, blocks
//! of 4 queries, a right context the mask rules out): the tower's output and the soft tokens
//! within 1e-4.

use std::path::{Path, PathBuf};

use strata_model::AudioTower;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gemma4-tiny-audio")
}

fn f32s(bytes: &[u8], name: &str) -> Vec<f32> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn audio_tower_matches_transformers_on_two_clips() {
    let tower = AudioTower::load(&fixture())
        .unwrap()
        .expect("an audio tower");
    let reference = std::fs::read(fixture().join("reference.safetensors")).unwrap();
    let bins = tower.config().subsampling_channels[0];
    for i in 0..2 {
        let features = f32s(&reference, &format!("features_{i}"));
        let out = tower.encode(&features, bins).unwrap();
        let want_tower = f32s(&reference, &format!("tower_{i}"));
        let want_soft = f32s(&reference, &format!("soft_{i}"));
        assert_eq!(out.tokens * tower.config().output_dims, want_tower.len());
        let (dt, ds) = (
            max_abs_diff(&out.tower, &want_tower),
            max_abs_diff(&out.soft_tokens, &want_soft),
        );
        println!(
            "clip {i}: {} soft tokens, tower off by {dt:.2e}, soft tokens by {ds:.2e}",
            out.tokens
        );
        assert!(
            dt < 1e-4 && ds < 1e-4,
            "clip {i}: tower {dt}, soft tokens {ds}"
        );
    }
}

#[test]
fn features_that_do_not_fit_the_tower_are_refused() {
    let tower = AudioTower::load(&fixture()).unwrap().unwrap();
    let bins = tower.config().subsampling_channels[0];
    for (values, b) in [
        (vec![0.0; 10 * 8], 8),
        (vec![0.0; 0], bins),
        (vec![0.0; bins + 1], bins),
    ] {
        let e = tower.encode(&values, b).unwrap_err().to_string();
        assert!(e.contains("bins"), "{e}");
    }
}

#[test]
fn a_checkpoint_without_audio_has_no_tower() {
    let dir = fixture().join("../gemma4-tiny-vision");
    assert!(AudioTower::load(&dir).unwrap().is_none());
}
