//! A little-endian IEEE half stored as two bytes, so block structs keep alignment 1.

use half::f16;

/// An IEEE binary16 value as it lies in a file (little-endian bytes).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    /// The value as f32 (exact).
    pub fn to_f32(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }

    /// Round-to-nearest-even conversion (what numpy's `astype(float16)` does).
    pub fn from_f32(v: f32) -> Self {
        Self(f16::from_f32(v).to_bits().to_le_bytes())
    }

    /// The smallest half that is `>= v`, for a non-negative finite `v` within half's range
    /// (saturates at the largest finite half). Quantizers use it so a stored scale never
    /// shrinks below the one the codes were computed for.
    pub fn round_up(v: f32) -> Self {
        let h = f16::from_f32(v);
        if h.is_infinite() || h.is_nan() {
            return Self(f16::MAX.to_bits().to_le_bytes());
        }
        if h.to_f32() >= v {
            return Self(h.to_bits().to_le_bytes());
        }
        // Positive halves are ordered like their bit patterns.
        let next = f16::from_bits(h.to_bits() + 1);
        let next = if next.is_infinite() { f16::MAX } else { next };
        Self(next.to_bits().to_le_bytes())
    }
}

impl std::fmt::Debug for F16Le {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_up_never_goes_below() {
        for v in [
            0.0f32, 1e-8, 0.1, 0.3333, 1.0, 1.0001, 1000.7, 65504.0, 70000.0,
        ] {
            let h = F16Le::round_up(v).to_f32();
            assert!(h >= v.min(65504.0), "{v} -> {h}");
            assert!(h <= (v * 1.001).max(6e-8), "{v} -> {h} too far");
        }
        assert_eq!(F16Le::from_f32(1.5).0, [0x00, 0x3e]);
        assert_eq!(F16Le([0x00, 0x3e]).to_f32(), 1.5);
    }
}
