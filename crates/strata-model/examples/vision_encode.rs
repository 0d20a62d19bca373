//! Times Gemma-4's vision tower on the host: random f32 weights at E2B's shape (hidden 768,
//! 16 layers, patches of 16, pooling 3, into the text width of 1536), images of 70, 140 and
//! 280 soft tokens (the processor's largest). Prints the median of `--runs` encodes per size.
//!
//! ```sh
//! cargo run --release -p strata-model --example vision_encode -- [--runs 3] [--tokens 70,140,280] [--ops]
//! ```
//! `--ops` times the tower as the CPU backend's ops (`DeviceVisionTower` on `CpuBackend`,
//! what a GPU runs) instead of the host tower.
//! `scripts/bench/vision_encode.py` times transformers' tower on the same shapes as the peer.

use std::collections::HashMap;
use std::time::Instant;

use safetensors::tensor::{Dtype, TensorView};
use strata_config::VisionConfig;
use strata_model::{DeviceVisionTower, VisionTower};
use strata_weights::Weights;

/// A deterministic generator (splitmix64) for the random weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let runs: usize = flag("--runs", "3").parse()?;
    let ops = args.iter().any(|a| a == "--ops");
    let sizes: Vec<usize> = flag("--tokens", "70,140,280")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let cfg = VisionConfig::from_hf_json(
        r#"{"model_type": "gemma4", "text_config": {"hidden_size": 1536},
            "vision_config": {"model_type": "gemma4_vision"}}"#,
    )?
    .ok_or("no vision config")?;
    let (h, inner, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let patch = 3 * cfg.patch_size * cfg.patch_size;
    let t = "model.vision_tower.";
    let mut shapes: Vec<(String, Vec<usize>, f32)> = vec![
        (
            format!("{t}patch_embedder.input_proj.weight"),
            vec![h, patch],
            0.05,
        ),
        (
            format!("{t}patch_embedder.position_embedding_table"),
            vec![2, cfg.position_embedding_size, h],
            0.5,
        ),
        (
            "model.embed_vision.embedding_projection.weight".into(),
            vec![cfg.text_hidden_size, h],
            0.05,
        ),
    ];
    for l in 0..cfg.num_layers {
        let p = format!("{t}encoder.layers.{l}.");
        for n in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            shapes.push((format!("{p}{n}.weight"), vec![h], 1.0));
        }
        for (n, rows, cols) in [
            ("self_attn.q_proj", qd, h),
            ("self_attn.k_proj", kvd, h),
            ("self_attn.v_proj", kvd, h),
            ("self_attn.o_proj", h, qd),
            ("mlp.gate_proj", inner, h),
            ("mlp.up_proj", inner, h),
            ("mlp.down_proj", h, inner),
        ] {
            shapes.push((format!("{p}{n}.linear.weight"), vec![rows, cols], 0.05));
        }
        shapes.push((format!("{p}self_attn.q_norm.weight"), vec![d], 1.0));
        shapes.push((format!("{p}self_attn.k_norm.weight"), vec![d], 1.0));
    }
    let mut rng = Rng(7);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, shape, scale)| {
            let n: usize = shape.iter().product();
            // Norm weights near their scale, matrices small: activations stay O(1).
            let offset = if shape.len() == 1 { scale } else { 0.0 };
            let vals: Vec<f32> = (0..n)
                .map(|_| offset + rng.next() * if offset > 0.0 { 0.2 } else { scale })
                .collect();
            (name, shape, bytemuck::cast_slice(&vals).to_vec())
        })
        .collect();
    let views: HashMap<String, TensorView> = data
        .iter()
        .map(|(name, shape, bytes)| {
            let v = TensorView::new(Dtype::F32, shape.clone(), bytes).expect("tensor view");
            (name.clone(), v)
        })
        .collect();
    let dir = tempfile::tempdir()?;
    safetensors::serialize_to_file(&views, None, &dir.path().join("model.safetensors"))?;
    drop(views);
    drop(data);
    let tower = VisionTower::from_weights(cfg.clone(), &Weights::open(dir.path())?)?;
    let on_ops = if ops {
        let b = strata_kernels::cpu::CpuBackend::new();
        Some(DeviceVisionTower::new(
            b,
            &tower,
            strata_kernels::DType::F32,
        )?)
    } else {
        None
    };
    let k = cfg.pooling_kernel_size;
    println!("| soft tokens | patches | median ms | ms a soft token |");
    println!("|---:|---:|---:|---:|");
    for tokens in sizes {
        // The processor's grid for a 5:7 image of this many soft tokens, near enough.
        let th = ((tokens as f64 * 5.0 / 7.0).sqrt().floor() as usize).max(1);
        let tw = tokens / th;
        let (ph, pw) = (th * k, tw * k);
        let n = ph * pw;
        let mut pixels = vec![0.0f32; n * patch];
        pixels.iter_mut().for_each(|v| *v = rng.next() + 0.5);
        let positions: Vec<[i64; 2]> = (0..n).map(|i| [(i % pw) as i64, (i / pw) as i64]).collect();
        let mut times = Vec::new();
        for _ in 0..runs {
            let t0 = Instant::now();
            let tokens = match &on_ops {
                Some(t) => t.encode(&pixels, &positions)?.tokens,
                None => tower.encode(&pixels, &positions)?.tokens,
            };
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            assert_eq!(tokens, th * tw);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "| {} | {n} | {median:.0} | {:.1} |",
            th * tw,
            median / (th * tw) as f64
        );
    }
    Ok(())
}
