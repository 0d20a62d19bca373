//! Rotary position embedding parameters and their inverse-frequency tables.

use serde::Serialize;

/// How the frequencies are derived.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeKind {
    /// `inv_freq_i = theta^(-2i/rotary_dim)` over the rotated width.
    Default,
    /// Gemma-4 full layers: exponent over the *full* head dim, only the first
    /// `partial_rotary_factor * head_dim / 2` pairs rotate, the rest pass through.
    Proportional,
    /// Frequencies divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama-3 long-context smoothing.
    Llama3 {
        /// Divisor of the low frequencies (long wavelengths).
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are
        /// divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are
        /// kept; those between are blended.
        high_freq_factor: f64,
        /// The context length the model was first trained at, in tokens.
        original_max_position_embeddings: f64,
    },
}

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)` ("rotate half", GPT-NeoX): every HF checkpoint, and GGUF Gemma/Qwen3.
    Neox,
    /// Pairs `(2i, 2i + 1)`: GGUF Llama, whose converter permuted q/k rows to match.
    Interleaved,
}

/// A layer's rotary position embedding: base, frequency scaling, rotated fraction, pairing.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RopeConfig {
    /// Base of the frequencies (`rope_theta`).
    pub theta: f64,
    /// How the frequencies are derived from `theta`.
    pub kind: RopeKind,
    /// Fraction of the head dim that rotates (1.0 for all but Gemma-4 full layers).
    pub partial_rotary_factor: f64,
    /// Which dimensions form a rotated pair.
    pub style: RopeStyle,
}

impl RopeConfig {
    /// `theta` and `kind`, every dimension rotating, NeoX pairs.
    pub fn new(theta: f64, kind: RopeKind) -> Self {
        Self {
            theta,
            kind,
            partial_rotary_factor: 1.0,
            style: RopeStyle::Neox,
        }
    }

    /// The `head_dim / 2` inverse frequencies (pair `i` rotates by `pos * inv_freq[i]`);
    /// pairs that do not rotate get 0, so cos = 1 and sin = 0 exactly.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let half = head_dim / 2;
        match self.kind {
            RopeKind::Proportional => {
                let rotated = (self.partial_rotary_factor * head_dim as f64 / 2.0).floor() as usize;
                (0..half)
                    .map(|i| {
                        if i < rotated {
                            self.theta.powf(-(2.0 * i as f64) / head_dim as f64)
                        } else {
                            0.0
                        }
                    })
                    .collect()
            }
            _ => {
                // The rotated width; pairs beyond it pass through.
                let rot = ((self.partial_rotary_factor * head_dim as f64) as usize) & !1;
                (0..half)
                    .map(|i| {
                        if 2 * i >= rot {
                            return 0.0;
                        }
                        let base = self.theta.powf(-(2.0 * i as f64) / rot as f64);
                        self.scale(base)
                    })
                    .collect()
            }
        }
    }

    fn scale(&self, freq: f64) -> f64 {
        match self.kind {
            RopeKind::Default | RopeKind::Proportional => freq,
            RopeKind::Linear { factor } => freq / factor,
            RopeKind::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                if wavelen < high_wavelen {
                    freq
                } else if wavelen > low_wavelen {
                    freq / factor
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * freq / factor + smooth * freq
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma4_proportional_rotates_first_64_pairs_over_512() {
        let mut r = RopeConfig::new(1e6, RopeKind::Proportional);
        r.partial_rotary_factor = 0.25;
        let f = r.inv_freq(512);
        assert_eq!(f.len(), 256);
        assert_eq!(f[0], 1.0);
        assert!((f[63] - 1e6f64.powf(-126.0 / 512.0)).abs() < 1e-15);
        assert!(f[64..].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn default_rope_uses_full_width() {
        let f = RopeConfig::new(1e4, RopeKind::Default).inv_freq(256);
        assert!((f[1] - 1e4f64.powf(-2.0 / 256.0)).abs() < 1e-15);
        assert!(f.iter().all(|&x| x > 0.0));
    }

    #[test]
    fn linear_divides_and_llama3_keeps_high_frequencies() {
        let f = RopeConfig::new(1e4, RopeKind::Linear { factor: 8.0 }).inv_freq(64);
        assert_eq!(f[0], 1.0 / 8.0);
        let l3 = RopeConfig::new(
            5e5,
            RopeKind::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        )
        .inv_freq(64);
        assert_eq!(l3[0], 1.0);
        let plain = RopeConfig::new(5e5, RopeKind::Default).inv_freq(64);
        assert!((l3[31] - plain[31] / 32.0).abs() < 1e-18);
    }
}
