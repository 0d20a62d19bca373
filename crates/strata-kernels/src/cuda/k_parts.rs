//! Products split over k whose reader adds the parts ([`crate::Backend::matmul_parts`]).
//!
//! At decode row counts cuBLASLt runs the long-k single products (the down projection,
//! k = 6144-12288) as a split-k GEMM followed by a `splitKreduce_kernel` launch, and the o
//! projection (k = 2048) on tiles that leave much of the GPU idle. The same product as a
//! strided batch over k slices, its partial rows left for the residual norm that reads
//! the result anyway (`kernels/norm.cu` adds a row's parts as it loads them), needs no
//! reduce launch and lets cuBLASLt fill the GPU with the batch. On an H200 the E2B decode
//! step at 100 sequences went from 3.85 to 3.73 ms; below 65 rows the split batch also
//! beat the skinny GEMM's cluster split-k on the same products (32 sequences 3.01 ->
//! 2.89 ms), so it takes them from 3 rows (`docs/perf-notes.md`, "Products split over
//! k").

use super::matmul_path::{Form, MatmulPath};
use super::CudaBackend;
use crate::tuning::defaults;
use crate::{DType, DeviceBuffer, MatmulShape};

use super::buffer::CudaBuffer;

/// When a product is split over k: at most `max_rows` rows, and no part shorter than
/// `min_part` inputs. From `min_rows` rows a product leaves the skinny GEMM for the split
/// (below it, only a product that would run on cuBLAS anyway is split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KParts {
    /// Rows from which a product that would run on the skinny GEMM is split instead.
    pub min_rows: usize,
    /// Most rows of a product that is split.
    pub max_rows: usize,
    /// Fewest inputs (k) a part may have.
    pub min_part: usize,
}

impl KParts {
    /// The rows measured to gain (the decode graphs' buckets that go to cuBLAS, up to
    /// the largest, 256 rows), parts of at least 256 inputs.
    pub const DEFAULT: Self = Self {
        min_rows: defaults::K_PARTS_MIN_ROWS,
        max_rows: defaults::K_PARTS_MAX_ROWS,
        min_part: 256,
    };

    /// Never split.
    pub const OFF: Self = Self {
        min_rows: usize::MAX,
        max_rows: 0,
        min_part: usize::MAX,
    };

    /// The row limits of [`crate::CudaTuning`] (`k_parts_max_rows` 0: never split).
    pub(super) fn from_tuning(tuning: &crate::CudaTuning) -> Self {
        Self {
            min_rows: tuning.k_parts_min_rows,
            max_rows: tuning.k_parts_max_rows,
            ..Self::DEFAULT
        }
    }

    /// Whether a product over `rows` rows that would run as `path` is split: a bf16 GEMM,
    /// or from `min_rows` a skinny GEMM, within `max_rows`.
    pub(super) fn splits(&self, path: MatmulPath, rows: usize) -> bool {
        let taken = match path {
            MatmulPath::GemmBf16 => true,
            MatmulPath::Skinny => rows >= self.min_rows,
            _ => false,
        };
        taken && rows > 0 && rows <= self.max_rows
    }

    /// The parts of a product of `k` inputs and `n` outputs: four below 2048 outputs
    /// (E2B's o and down, 1536), two from there (E4B's, 2560), as measured fastest; fewer
    /// where a part would fall under `min_part` inputs or start off a 16-byte boundary.
    pub(super) fn parts_for(&self, k: usize, n: usize) -> usize {
        let first = if n < 2048 { 4 } else { 2 };
        [first, 2]
            .into_iter()
            .find(|&p| k.is_multiple_of(p * 8) && k / p >= self.min_part)
            .unwrap_or(1)
    }
}

impl CudaBackend {
    /// Sets when products split over k (see [`KParts`]); returns the backend for chaining.
    pub fn with_k_parts(mut self, rule: KParts) -> Self {
        self.k_parts = rule;
        self
    }

    /// [`crate::Backend::matmul_k_parts`]: more than one only for a bf16 weight in the bf16
    /// mode, past the GEMV's rows, where the small-weight GEMM does not take the product,
    /// within the rule's rows (from `min_rows` in place of the skinny GEMM, below it only
    /// where the product would run on cuBLAS).
    pub(super) fn k_parts_for(&self, w: &CudaBuffer, shape: MatmulShape, rows: usize) -> usize {
        let (k, n) = (shape.in_features, shape.out_features);
        let path = self.matmul_path(Form::Single, w.dtype() == DType::BF16, (rows, k, n));
        if self.k_parts.splits(path, rows) {
            self.k_parts.parts_for(k, n)
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KParts, MatmulPath};

    #[test]
    fn splits_take_cublas_products_and_skinny_ones_from_min_rows() {
        let r = KParts::DEFAULT;
        let cases = [
            // (path, rows, split)
            (MatmulPath::GemmBf16, 1, true),
            (MatmulPath::GemmBf16, 256, true),
            (MatmulPath::GemmBf16, 257, false),
            (MatmulPath::GemmBf16, 0, false),
            (MatmulPath::Skinny, 2, false),
            (MatmulPath::Skinny, 3, true),
            (MatmulPath::Gemv, 2, false),
            (MatmulPath::SmallGemm, 3, false),
            (MatmulPath::Sgemm, 3, false),
        ];
        for (path, rows, want) in cases {
            assert_eq!(r.splits(path, rows), want, "{path:?} at {rows} rows");
        }
        assert!(!KParts::OFF.splits(MatmulPath::GemmBf16, 100));
    }

    #[test]
    fn parts_follow_the_output_width_and_the_shortest_part() {
        let r = KParts::DEFAULT;
        // E2B: down (k 6144, 12288) and o (k 2048) of 1536 outputs; E4B's 2560.
        assert_eq!(r.parts_for(6144, 1536), 4);
        assert_eq!(r.parts_for(12288, 1536), 4);
        assert_eq!(r.parts_for(2048, 1536), 4);
        assert_eq!(r.parts_for(10240, 2560), 2);
        assert_eq!(r.parts_for(2048, 2560), 2);
        // Too short for four parts of 256, long enough for two.
        assert_eq!(r.parts_for(768, 1536), 2);
        assert_eq!(r.parts_for(256, 1536), 1);
        // A part must start 16-byte aligned (8 bf16 inputs).
        assert_eq!(r.parts_for(2052, 1536), 1);
        assert_eq!(KParts::OFF.parts_for(6144, 1536), 1);
    }
}
