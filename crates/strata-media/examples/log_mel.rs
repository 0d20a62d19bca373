//! The log-mel features of one second of a 440 Hz tone, as Gemma-4's audio tower reads them.

use strata_media::LogMel;

fn main() {
    let clip: Vec<f32> = (0..16_000)
        .map(|n| (2.0 * std::f32::consts::PI * 440.0 * n as f32 / 16_000.0).sin() * 0.5)
        .collect();
    let f = LogMel::gemma4().features(&clip);
    let frames = f.mask.len();
    let loudest = (0..f.bins)
        .max_by(|&a, &b| f.values[a].total_cmp(&f.values[b]))
        .unwrap_or(0);
    println!(
        "{frames} frames of {} mel bins; the loudest bin of the first frame is {loudest}",
        f.bins
    );
}
