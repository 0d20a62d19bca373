//! Times Gemma-4's audio tower on the host on the checkpoint `scripts/bench/audio_encode.py`
//! writes (E2B's tower at its real shape, random weights), checks its soft tokens for that
//! script's clip against transformers', then times clips of `--seconds`.
//!
//! ```sh
//! python3 scripts/bench/audio_encode.py --out /tmp/audio-e2b
//! cargo run --release -p strata-model --example audio_encode -- --model /tmp/audio-e2b
//! ```

use std::time::Instant;

use strata_model::AudioTower;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let dir = std::path::PathBuf::from(flag("--model", "/tmp/audio-e2b"));
    let runs: usize = flag("--runs", "3").parse()?;
    let tower = AudioTower::load(&dir)?.ok_or("no audio_config in the checkpoint")?;
    let bins = tower.config().subsampling_channels[0];
    let bytes = std::fs::read(dir.join("ref.safetensors"))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let f32s = |name: &str| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        Ok(st
            .tensor(name)?
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let (features, want) = (f32s("features")?, f32s("soft")?);
    let got = tower.encode(&features, bins)?;
    let diff = got
        .soft_tokens
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    println!(
        "soft tokens of the reference clip: {} against transformers' {}, largest difference {diff:.2e} (values up to {scale:.2})",
        got.soft_tokens.len(),
        want.len()
    );
    println!("| seconds | frames | soft tokens | median ms | ms a second of audio |");
    println!("|---:|---:|---:|---:|---:|");
    for sec in flag("--seconds", "5,10,30").split(',') {
        let sec: f64 = sec.parse()?;
        let frames = (sec * 100.0) as usize;
        let feats: Vec<f32> = (0..frames * bins)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut times = Vec::new();
        let mut tokens = 0;
        for _ in 0..runs {
            let t0 = Instant::now();
            tokens = tower.encode(&feats, bins)?.tokens;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "| {sec} | {frames} | {tokens} | {median:.0} | {:.0} |",
            median / sec
        );
    }
    Ok(())
}
