//! A gated MLP's gate and up as one batched GEMM ([`crate::Backend::gated_matmul`]).
//!
//! At 65-128 rows the 128-token wgmma tile of `kernels/skinny_gemm.cu` ran gate and up with
//! the activation in its epilogue, and streamed their weights at 2.0-2.6 TB/s: each stage
//! reads 128-byte pieces of 128 rows of each weight, the pattern that sets its rate. Here
//! cuBLASLt runs both products as a strided batch of two (the second weight's distance
//! from the first as the batch stride, the token rows shared, each product a half of every
//! output row), bf16 out, and `act_mul_bf16_pairs` writes `act(gate) * up` for the down
//! projection: one more launch, and on an H200 the E2B decode step at 100 sequences went
//! from 3.69-3.70 to 3.63-3.65 ms, E4B's from 6.41-6.44 to 6.23-6.26 (`docs/perf-notes.md`,
//! "Three decode-step changes at 65-256 rows").

use cudarc::driver::DevicePtrMut;

use super::buffer::CudaBuffer;
use super::matmul::GemmOut;
use super::{device_err, CudaBackend};
use crate::tuning::defaults;
use crate::{Activation, Result};

/// The rows at which a gated product over bf16 weights, in the bf16 mode, runs as the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairRows {
    /// Fewest rows (tokens) that run as the pair.
    pub min_rows: usize,
    /// Most rows that run as the pair.
    pub max_rows: usize,
}

impl PairRows {
    /// Where it was measured to gain: past the 64-token tile, up to the largest decode
    /// graph (256 rows; the GEMM plans of a batched product cover decode row counts).
    pub const DEFAULT: Self = Self {
        min_rows: defaults::GATED_PAIR_MIN_ROWS,
        max_rows: defaults::GATED_PAIR_MAX_ROWS,
    };

    /// Never.
    pub const OFF: Self = Self {
        min_rows: usize::MAX,
        max_rows: 0,
    };

    /// The limits of [`crate::CudaTuning`] (`gated_pair_max_rows` 0: never).
    pub(super) fn from_tuning(tuning: &crate::CudaTuning) -> Self {
        Self {
            min_rows: tuning.gated_pair_min_rows,
            max_rows: tuning.gated_pair_max_rows,
        }
    }
}

impl CudaBackend {
    /// Sets where gated products run as the batched pair; returns the backend for chaining.
    pub fn with_gated_pair(mut self, rows: PairRows) -> Self {
        self.gated_pair = rows;
        self
    }

    /// `out [t, n] = act(x gate^T) * (x up^T)` as the pair (callers check the shapes and
    /// `PathLimits::gated_pair`); with `twin`, into `out`'s bf16 twin alone.
    pub(super) fn gated_pair(
        &self,
        act: Activation,
        x: &CudaBuffer,
        [gate, up]: [&CudaBuffer; 2],
        (t, k, n): (usize, usize, usize),
        out: &mut CudaBuffer,
        twin: bool,
    ) -> Result<()> {
        let xb = self.bf16_operand(x, t * k)?;
        // SAFETY: the GEMM writes all t * 2n values before the activation reads them.
        let mut y = unsafe { self.stream.alloc::<u16>(t * 2 * n) }
            .map_err(device_err("allocating gated matmul scratch"))?;
        let gate_first = {
            let (yp, _g) = y.device_ptr_mut(&self.stream);
            // SAFETY: y holds t * 2 * n bf16 values (allocated above); the weights hold
            // n * k values each and xb t * k (the callers' checks).
            unsafe { self.gemm_pair_bf16_to(&xb, [gate, up], (t, k, n), yp, GemmOut::Bf16)? }
        };
        self.act_mul_bf16_pairs(act, &y, (t, n), gate_first, out, twin)
    }
}
