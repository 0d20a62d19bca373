//! Log-mel features against transformers' `Gemma4AudioFeatureExtractor` on two clips
//! (tests/fixtures/media/logmel.safetensors, made by scripts/reference/make_logmel_fixture.py).

use std::path::Path;

use strata_media::LogMel;

#[test]
fn gemma4_log_mel_features_match_transformers() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/media/logmel.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mel = LogMel::gemma4();
    for i in 0..2 {
        let got = mel.features(&f32s(&format!("clip_{i}")));
        let want = f32s(&format!("features_{i}"));
        let mask: Vec<bool> = st
            .tensor(&format!("mask_{i}"))
            .unwrap()
            .data()
            .iter()
            .map(|&b| b != 0)
            .collect();
        assert_eq!(got.bins, 128);
        assert_eq!(got.mask, mask, "clip {i}: frames and mask");
        assert_eq!(got.values.len(), want.len(), "clip {i}");
        let d = got
            .values
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("clip {i}: {} frames, max abs diff {d:.2e}", mask.len());
        assert!(d < 1e-5, "clip {i}: off by {d}");
    }
}
