//! Element types of backend buffers and borrowed host data to upload.

use half::{bf16, f16};

/// Element type of a buffer. Activations are `F32` on the CPU backend; weights may be any
/// of these. A GPU backend may keep activations in `BF16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 single precision (4 bytes).
    F32,
    /// bfloat16: f32's exponent range with an 8-bit significand (2 bytes).
    BF16,
    /// IEEE 754 half precision (2 bytes).
    F16,
}

impl DType {
    /// Bytes one element takes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// `x` rounded to this type and widened back: what a buffer of this dtype stores.
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::BF16 => bf16::from_f32(x).to_f32(),
            DType::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Unit roundoff (half the distance from 1.0 to the next value).
    pub fn unit_roundoff(self) -> f32 {
        match self {
            DType::F32 => f32::EPSILON / 2.0,
            DType::BF16 => 1.0 / 256.0,
            DType::F16 => 1.0 / 2048.0,
        }
    }
}

/// Borrowed host data of a known dtype, for [`crate::Backend::upload`]. Lets weights read
/// from a checkpoint go to the device without a detour through f32.
#[derive(Clone, Copy, Debug)]
pub enum HostSlice<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    BF16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
}

impl HostSlice<'_> {
    /// The element type of the borrowed slice.
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::F16(_) => DType::F16,
        }
    }

    /// Number of elements (not bytes).
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(s) => s.len(),
            HostSlice::BF16(s) => s.len(),
            HostSlice::F16(s) => s.len(),
        }
    }

    /// Whether the slice holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
