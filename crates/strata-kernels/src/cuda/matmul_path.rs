//! Which kernel a product runs as: a pure function of the product's shape, its weights'
//! dtype and the backend's limits, so that the launchers only launch and the choice's
//! boundaries are tested without a GPU.

use super::fused::{GEMV_MAX_MATS, GEMV_MAX_ROWS};
use super::gated_pair::PairRows;
use super::skinny_gemm::{SINGLE_MAX_ROWS, SKINNY_MAX_MATS, STAGE_K};
use super::small_gemm::{feature_tile, SmallRows};
use super::CudaBackend;

/// What the choice reads from the backend: its mode and row limits (from
/// [`crate::CudaTuning`] and the device's tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PathLimits {
    /// The bf16 speed mode ([`CudaBackend::with_bf16_gemm`]).
    pub bf16_gemm: bool,
    pub gemv_max_rows: usize,
    pub small_rows: SmallRows,
    /// 0: the device runs no skinny GEMM.
    pub skinny_max_rows: usize,
    pub gated_pair: PairRows,
}

impl PathLimits {
    /// Whether `t` rows of `k` against bf16 weights take the GEMV (`kernels/gemv.cu`).
    pub(super) fn gemv(&self, bf16: bool, t: usize, k: usize) -> bool {
        bf16 && t >= 1 && t <= self.gemv_max_rows.min(GEMV_MAX_ROWS) && k.is_multiple_of(8)
    }

    /// Whether a bf16 product of `t` rows by a `[n, k]` weight runs as the small-weight
    /// GEMM (`kernels/small_gemm.cu`).
    pub(super) fn small_gemm(&self, bf16: bool, t: usize, k: usize, n: usize) -> bool {
        self.bf16_gemm
            && bf16
            && t >= self.small_rows.min
            && t <= self.small_rows.max
            && feature_tile(n, k).is_some()
    }

    /// Whether a bf16 product over `t` rows of `k` takes the skinny GEMM
    /// (`kernels/skinny_gemm.cu`); `fused`: the launch covers several weights (q / k / v,
    /// or gate and up with their activation), which it takes up to `skinny_max_rows`. A
    /// launch of one weight takes it up to `SINGLE_MAX_ROWS` only.
    pub(super) fn skinny(&self, bf16: bool, t: usize, k: usize, fused: bool) -> bool {
        let max_rows = if fused {
            self.skinny_max_rows
        } else {
            self.skinny_max_rows.min(SINGLE_MAX_ROWS)
        };
        self.bf16_gemm
            && bf16
            && t > self.gemv_max_rows
            && t <= max_rows
            && k >= STAGE_K
            && k.is_multiple_of(STAGE_K)
    }

    /// Whether a gated product of bf16 weights over `t` rows with `n` features runs as the
    /// batched pair (`gated_pair.rs`): in the bf16 mode, within its rows, `n` a multiple
    /// of 8 (the activation pass's 16-byte vectors).
    pub(super) fn gated_pair(&self, t: usize, n: usize) -> bool {
        self.bf16_gemm
            && (self.gated_pair.min_rows..=self.gated_pair.max_rows).contains(&t)
            && n.is_multiple_of(8)
    }
}

/// The operation a product belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// One weight ([`crate::Backend::matmul`]).
    Single,
    /// This many weights sharing the input ([`crate::Backend::matmul_shared_input`]).
    Shared(usize),
    /// A gated MLP's gate and up, `act(gate) * up` ([`crate::Backend::gated_matmul`]).
    Gated,
    /// One gate times a table slice ([`crate::Backend::gated_slice_matmul`]).
    Slice,
}

/// A product to place: `t` rows of `k` inputs against weights of `n` outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Product {
    pub form: Form,
    /// Every weight is BF16.
    pub bf16: bool,
    pub t: usize,
    pub k: usize,
    pub n: usize,
}

/// How a product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MatmulPath {
    /// One GEMV launch over every weight, f32 activations.
    Gemv,
    /// `kernels/small_gemm.cu`.
    SmallGemm,
    /// One `kernels/skinny_gemm.cu` launch over every weight.
    Skinny,
    /// Gate and up as one batched cuBLASLt GEMM, then the activation pass.
    GatedPair,
    /// cuBLAS(Lt) bf16 GEMMs on one bf16 operand.
    GemmBf16,
    /// One weight widened to f32 for SGEMM (the exact path).
    Sgemm,
    /// Each weight's own product ([`Form::Single`]'s choice), then whatever joins them.
    Separate,
}

impl MatmulPath {
    /// The path of `p` under `l`. Each form tries its paths in the order its launcher has
    /// always used; at the default limits the row ranges do not overlap, so the order only
    /// matters for limits moved by [`crate::CudaTuning`].
    pub(super) fn choose(p: Product, l: &PathLimits) -> Self {
        use MatmulPath::*;
        let Product {
            form,
            bf16,
            t,
            k,
            n,
        } = p;
        match form {
            Form::Single => {
                if l.gemv(bf16, t, k) {
                    Gemv
                } else if l.small_gemm(bf16, t, k, n) {
                    SmallGemm
                } else if l.skinny(bf16, t, k, false) {
                    Skinny
                } else if l.bf16_gemm && bf16 {
                    GemmBf16
                } else {
                    Sgemm
                }
            }
            Form::Shared(mats) => {
                if t == 0 || !bf16 {
                    Separate
                } else if mats <= GEMV_MAX_MATS && l.gemv(true, t, k) {
                    Gemv
                } else if mats <= SKINNY_MAX_MATS && l.skinny(true, t, k, mats > 1) {
                    Skinny
                } else if l.bf16_gemm {
                    GemmBf16
                } else {
                    Separate
                }
            }
            Form::Gated => {
                if !bf16 {
                    Separate
                } else if l.gemv(true, t, k) {
                    Gemv
                } else if l.gated_pair(t, n) {
                    GatedPair
                } else if l.skinny(true, t, k, true) {
                    Skinny
                } else if l.bf16_gemm {
                    GemmBf16
                } else {
                    Separate
                }
            }
            Form::Slice => {
                if l.small_gemm(bf16, t, k, n) {
                    SmallGemm
                } else if l.skinny(bf16, t, k, false) {
                    Skinny
                } else if l.gemv(bf16, t, k) {
                    Gemv
                } else {
                    Separate
                }
            }
        }
    }
}

impl CudaBackend {
    pub(super) fn path_limits(&self) -> PathLimits {
        PathLimits {
            bf16_gemm: self.bf16_gemm,
            gemv_max_rows: self.gemv_max_rows,
            small_rows: self.small_rows,
            skinny_max_rows: self.skinny_max_rows,
            gated_pair: self.gated_pair,
        }
    }

    /// [`MatmulPath::choose`] under this backend's limits.
    pub(super) fn matmul_path(
        &self,
        form: Form,
        bf16: bool,
        (t, k, n): (usize, usize, usize),
    ) -> MatmulPath {
        MatmulPath::choose(
            Product {
                form,
                bf16,
                t,
                k,
                n,
            },
            &self.path_limits(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::MatmulPath::*;
    use super::*;

    /// An H200 in the bf16 mode at the default tuning.
    const H200: PathLimits = PathLimits {
        bf16_gemm: true,
        gemv_max_rows: 2,
        small_rows: SmallRows { min: 3, max: 128 },
        skinny_max_rows: 128,
        gated_pair: PairRows::DEFAULT,
    };

    /// E2B's shapes: the o / down projection's k and n, and a per-layer-input gate (a
    /// small weight: 256 outputs).
    const K: usize = 2048;
    const N: usize = 1536;
    const SMALL_N: usize = 256;

    fn path(form: Form, bf16: bool, t: usize, k: usize, n: usize, l: &PathLimits) -> MatmulPath {
        MatmulPath::choose(
            Product {
                form,
                bf16,
                t,
                k,
                n,
            },
            l,
        )
    }

    #[test]
    fn gemv_takes_bf16_rows_within_the_limit() {
        let at = |gemv_max_rows| PathLimits {
            gemv_max_rows,
            ..H200
        };
        assert!(at(2).gemv(true, 1, 1536));
        assert!(at(2).gemv(true, 2, 1536));
        assert!(!at(2).gemv(true, 3, 1536));
        assert!(at(8).gemv(true, 8, 1536));
        assert!(!at(9).gemv(true, 9, 1536));
        assert!(!at(2).gemv(true, 1, 1537));
        assert!(!at(2).gemv(false, 1, 1536));
        assert!(!at(0).gemv(true, 1, 1536));
    }

    #[test]
    fn single_weight_boundaries() {
        let cases = [
            // (rows, n, path)
            (1, N, Gemv),
            (2, N, Gemv),
            (3, N, Skinny),
            (64, N, Skinny),
            (65, N, GemmBf16),
            (1, SMALL_N, Gemv),
            (3, SMALL_N, SmallGemm),
            (128, SMALL_N, SmallGemm),
            (129, SMALL_N, GemmBf16),
            (4096, N, GemmBf16),
        ];
        for (t, n, want) in cases {
            assert_eq!(
                path(Form::Single, true, t, K, n, &H200),
                want,
                "{t} rows, n {n}"
            );
        }
        // The exact path keeps f32: the GEMV still, then SGEMM.
        let exact = PathLimits {
            bf16_gemm: false,
            ..H200
        };
        assert_eq!(path(Form::Single, true, 2, K, N, &exact), Gemv);
        assert_eq!(path(Form::Single, true, 3, K, N, &exact), Sgemm);
        assert_eq!(path(Form::Single, false, 1, K, N, &H200), Sgemm);
        // k off the GEMV's 8-value chunks and the skinny GEMM's stage.
        assert_eq!(path(Form::Single, true, 1, K + 4, N, &H200), GemmBf16);
        assert_eq!(path(Form::Single, true, 3, K + 8, N, &H200), GemmBf16);
        // A GPU whose skinny tiles stop at 32 rows.
        let sm100 = PathLimits {
            skinny_max_rows: 32,
            ..H200
        };
        assert_eq!(path(Form::Single, true, 32, K, N, &sm100), Skinny);
        assert_eq!(path(Form::Single, true, 33, K, N, &sm100), GemmBf16);
    }

    #[test]
    fn shared_input_boundaries() {
        let cases = [
            // (weights, rows, path)
            (3, 2, Gemv),
            (4, 2, GemmBf16),
            (3, 3, Skinny),
            (3, 128, Skinny),
            (3, 129, GemmBf16),
            (1, 64, Skinny),
            (1, 65, GemmBf16),
            (4, 3, GemmBf16),
        ];
        for (mats, t, want) in cases {
            let got = path(Form::Shared(mats), true, t, K, N, &H200);
            assert_eq!(got, want, "{mats} weights, {t} rows");
        }
        assert_eq!(path(Form::Shared(3), false, 1, K, N, &H200), Separate);
        assert_eq!(path(Form::Shared(3), true, 0, K, N, &H200), Separate);
        let exact = PathLimits {
            bf16_gemm: false,
            ..H200
        };
        assert_eq!(path(Form::Shared(3), true, 1, K, N, &exact), Gemv);
        assert_eq!(path(Form::Shared(3), true, 3, K, N, &exact), Separate);
    }

    #[test]
    fn gated_boundaries() {
        let cases = [
            (1, Gemv),
            (2, Gemv),
            (3, Skinny),
            (64, Skinny),
            (65, GatedPair),
            (256, GatedPair),
            (257, GemmBf16),
        ];
        for (t, want) in cases {
            assert_eq!(path(Form::Gated, true, t, N, 6144, &H200), want, "{t} rows");
        }
        // Features off the activation pass's vectors leave the pair to the skinny GEMM.
        assert_eq!(path(Form::Gated, true, 65, N, 6148, &H200), Skinny);
        assert_eq!(path(Form::Gated, true, 129, N, 6148, &H200), GemmBf16);
        assert_eq!(path(Form::Gated, false, 1, N, 6144, &H200), Separate);
        let no_pair = PathLimits {
            gated_pair: PairRows::OFF,
            ..H200
        };
        assert_eq!(path(Form::Gated, true, 65, N, 6144, &no_pair), Skinny);
        assert_eq!(path(Form::Gated, true, 129, N, 6144, &no_pair), GemmBf16);
        let exact = PathLimits {
            bf16_gemm: false,
            ..H200
        };
        assert_eq!(path(Form::Gated, true, 3, N, 6144, &exact), Separate);
    }

    #[test]
    fn slice_boundaries() {
        let cases = [
            (1, SMALL_N, Gemv),
            (3, SMALL_N, SmallGemm),
            (128, SMALL_N, SmallGemm),
            (129, SMALL_N, Separate),
            (3, N, Skinny),
            (64, N, Skinny),
            (65, N, Separate),
        ];
        for (t, n, want) in cases {
            assert_eq!(
                path(Form::Slice, true, t, K, n, &H200),
                want,
                "{t} rows, n {n}"
            );
        }
        // The slice form tries the small GEMM first: moved under the GEMV's rows, it wins.
        let low = PathLimits {
            small_rows: SmallRows { min: 1, max: 128 },
            ..H200
        };
        assert_eq!(path(Form::Slice, true, 1, K, SMALL_N, &low), SmallGemm);
        assert_eq!(path(Form::Single, true, 1, K, SMALL_N, &low), Gemv);
    }
}
