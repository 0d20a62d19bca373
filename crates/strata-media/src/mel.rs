//! Log-mel features of Gemma-4's audio tower, as transformers' `Gemma4AudioFeatureExtractor`
//! computes them (its defaults: 16 kHz, frames of 20 ms every 10 ms, 128 HTK mel bins from 0
//! to 8 kHz, a periodic Hann window, `log(mel + 0.001)`):
//!
//! 1. the clip is padded with zeros to a multiple of `pad_to_multiple_of` samples (its mask
//!    marks the real ones), then with half a frame of zeros in front;
//! 2. frames of `frame_length + 1` samples every `hop_length`; without pre-emphasis the last
//!    sample of each is dropped, the rest windowed (f32, as the reference);
//! 3. the magnitude of each frame's real FFT (`fft_length`, the next power of two; f64, as
//!    numpy), times the mel filters, then `ln(x + mel_floor)`;
//! 4. a frame counts as real when the mask holds at its last sample; other frames are zeroed.

use std::f64::consts::PI;
use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

/// The extractor's settings (transformers' defaults for Gemma-4 by [`LogMel::gemma4`]).
pub struct LogMel {
    frame_length: usize,
    hop_length: usize,
    fft_length: usize,
    mel_bins: usize,
    mel_floor: f64,
    pad_to_multiple_of: usize,
    /// `[frame_length]`, f32 as the reference rounds it.
    window: Vec<f32>,
    /// `[fft_length / 2 + 1, mel_bins]`.
    filters: Vec<f64>,
    fft: Arc<dyn Fft<f64>>,
}

/// One clip's features.
#[derive(Clone, Debug, PartialEq)]
pub struct LogMelFeatures {
    /// `[frames, mel_bins]`; frames past the clip are zeros.
    pub values: Vec<f32>,
    /// Per frame, whether it holds the clip (not padding).
    pub mask: Vec<bool>,
    /// Mel bins a frame.
    pub bins: usize,
}

impl LogMel {
    /// Gemma-4's extractor: 16 kHz, 128 bins.
    pub fn gemma4() -> Self {
        Self::new(16_000, 128, 20.0, 10.0, 0.0, 8_000.0, 1e-3, 128)
    }

    /// An extractor with these settings (the names of transformers' arguments).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sampling_rate: usize,
        mel_bins: usize,
        frame_length_ms: f64,
        hop_length_ms: f64,
        min_frequency: f64,
        max_frequency: f64,
        mel_floor: f64,
        pad_to_multiple_of: usize,
    ) -> Self {
        let rate = sampling_rate as f64;
        let frame_length = (rate * frame_length_ms / 1000.0).round() as usize;
        let hop_length = (rate * hop_length_ms / 1000.0).round() as usize;
        let fft_length = frame_length.next_power_of_two();
        // numpy's `hanning(frame_length + 1)` without its last point: a periodic window.
        let m = frame_length + 1;
        let window = (0..frame_length)
            .map(|n| (0.5 - 0.5 * (2.0 * PI * n as f64 / (m - 1) as f64).cos()) as f32)
            .collect();
        let filters = mel_filters(
            fft_length / 2 + 1,
            mel_bins,
            min_frequency,
            max_frequency,
            rate,
        );
        let fft = FftPlanner::new().plan_fft_forward(fft_length);
        Self {
            frame_length,
            hop_length,
            fft_length,
            mel_bins,
            mel_floor,
            pad_to_multiple_of: pad_to_multiple_of.max(1),
            window,
            filters,
            fft,
        }
    }

    /// The features of one mono clip at the extractor's rate.
    pub fn features(&self, clip: &[f32]) -> LogMelFeatures {
        let padded_len = clip.len().div_ceil(self.pad_to_multiple_of) * self.pad_to_multiple_of;
        let left = self.frame_length / 2;
        let mut wave = vec![0.0f32; left + padded_len];
        wave[left..left + clip.len()].copy_from_slice(clip);
        let real_end = left + clip.len();
        let size = self.frame_length + 1;
        let frames = if wave.len() >= size {
            (wave.len() - size) / self.hop_length + 1
        } else {
            0
        };
        let bins = self.fft_length / 2 + 1;
        let mut values = Vec::with_capacity(frames * self.mel_bins);
        let mut mask = Vec::with_capacity(frames);
        let mut buf = vec![Complex::new(0.0f64, 0.0); self.fft_length];
        let mut magnitude = vec![0.0f64; bins];
        for f in 0..frames {
            let start = f * self.hop_length;
            // The frame's last sample decides whether it is the clip's.
            let real = start + size - 1 < real_end;
            mask.push(real);
            if !real {
                values.extend(std::iter::repeat_n(0.0, self.mel_bins));
                continue;
            }
            for (i, c) in buf.iter_mut().enumerate() {
                let v = if i < self.frame_length {
                    wave[start + i] * self.window[i]
                } else {
                    0.0
                };
                *c = Complex::new(v as f64, 0.0);
            }
            self.fft.process(&mut buf);
            for (m, c) in magnitude.iter_mut().zip(&buf) {
                *m = c.norm();
            }
            for j in 0..self.mel_bins {
                let mel: f64 = (0..bins)
                    .map(|k| magnitude[k] * self.filters[k * self.mel_bins + j])
                    .sum();
                values.push((mel + self.mel_floor).ln() as f32);
            }
        }
        LogMelFeatures {
            values,
            mask,
            bins: self.mel_bins,
        }
    }
}

/// HTK mel scale.
fn hz_to_mel(f: f64) -> f64 {
    2595.0 * (1.0 + f / 700.0).log10()
}

fn mel_to_hz(m: f64) -> f64 {
    700.0 * (10f64.powf(m / 2595.0) - 1.0)
}

/// Triangular filters between mel-spaced edges, unnormalized, `[bins, mel_bins]`, as
/// transformers' `mel_filter_bank(norm=None, mel_scale="htk")`.
fn mel_filters(bins: usize, mel_bins: usize, fmin: f64, fmax: f64, rate: f64) -> Vec<f64> {
    let (lo, hi) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let edges: Vec<f64> = (0..mel_bins + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (mel_bins + 1) as f64))
        .collect();
    let nyquist = (rate as usize / 2) as f64;
    let mut out = vec![0.0f64; bins * mel_bins];
    for k in 0..bins {
        let f = nyquist * k as f64 / (bins - 1) as f64;
        for j in 0..mel_bins {
            let down = (f - edges[j]) / (edges[j + 1] - edges[j]);
            let up = (edges[j + 2] - f) / (edges[j + 2] - edges[j + 1]);
            out[k * mel_bins + j] = down.min(up).max(0.0);
        }
    }
    out
}
