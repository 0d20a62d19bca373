//! Gemma-4's image processor against transformers' `Gemma4ImageProcessorPil` on two PNG
//! files, one enlarged and one (with alpha) shrunk (tests/fixtures/media, made by
//! scripts/reference/make_image_fixture.py): every patch value and position equal.

use std::path::{Path, PathBuf};

use strata_media::ImagePatcher;

fn media() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/media")
}

#[test]
fn patches_equal_transformers_pil_processor() {
    let bytes = std::fs::read(media().join("images.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let patcher = ImagePatcher {
        patch_size: 4,
        pooling: 2,
        max_soft_tokens: 70,
    };
    for i in 0..2 {
        let png = std::fs::read(media().join(format!("image_{i}.png"))).unwrap();
        let got = patcher.decode(&png).unwrap();
        let want: Vec<f32> = st
            .tensor(&format!("pixel_values_{i}"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
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
        assert_eq!(got.positions, positions, "image {i}: positions");
        assert_eq!(got.pixels.len(), want.len(), "image {i}");
        let differ = got.pixels.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "image {i}: {differ} values differ from Pillow's");
        assert_eq!(got.soft_tokens, 60, "image {i}");
    }
}

#[test]
fn bad_images_are_errors() {
    let p = ImagePatcher::gemma4();
    assert!(p.decode(b"not an image").is_err());
    assert!(p.decode(&[]).is_err());
    assert!(p.patches(&[0; 5], 1, 2).is_err());
    // A 1-pixel-high strip: one row of pooled patches, as wide as the budget allows.
    let (h, w) = p.target_size(1, 4000).unwrap();
    assert_eq!(h, 48);
    assert!(w <= 280 * 48 && w % 48 == 0, "{w}");
}
