//! The ggml tensor types a GGUF file can name, with their block geometry.

/// A ggml tensor type id as stored in a GGUF tensor directory.
///
/// Only the geometry lives here (elements per block, bytes per block), which is what the
/// container needs to check that every tensor's bytes lie inside the file. Decoding the
/// blocks is `strata-weights`' job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE 16-bit float.
    F16,
    /// 4-bit, blocks of 32 with an f16 scale (4.5 bits per weight).
    Q4_0,
    /// 4-bit, blocks of 32 with an f16 scale and minimum (5 bits per weight).
    Q4_1,
    /// 5-bit, blocks of 32 with an f16 scale (5.5 bits per weight).
    Q5_0,
    /// 5-bit, blocks of 32 with an f16 scale and minimum (6 bits per weight).
    Q5_1,
    /// 8-bit, blocks of 32 with an f16 scale (8.5 bits per weight).
    Q8_0,
    /// 8-bit, blocks of 32 with an f16 scale and the block's sum (9 bits per weight).
    Q8_1,
    /// k-quant 2-bit, super-blocks of 256 (2.625 bits per weight).
    Q2_K,
    /// k-quant 3-bit, super-blocks of 256 (3.4375 bits per weight).
    Q3_K,
    /// k-quant 4-bit, super-blocks of 256 (4.5 bits per weight).
    Q4_K,
    /// k-quant 5-bit, super-blocks of 256 (5.5 bits per weight).
    Q5_K,
    /// k-quant 6-bit, super-blocks of 256 (6.5625 bits per weight).
    Q6_K,
    /// k-quant 8-bit with an f32 scale and block sums, super-blocks of 256 (ggml's
    /// intermediate for activations).
    Q8_K,
    /// i-quant, super-blocks of 256 (2.0625 bits per weight).
    IQ2_XXS,
    /// i-quant, super-blocks of 256 (2.3125 bits per weight).
    IQ2_XS,
    /// i-quant, super-blocks of 256 (3.0625 bits per weight).
    IQ3_XXS,
    /// i-quant, super-blocks of 256 (1.5625 bits per weight).
    IQ1_S,
    /// Non-linear 4-bit codebook, blocks of 32 with an f16 scale (4.5 bits per weight).
    IQ4_NL,
    /// i-quant, super-blocks of 256 (3.4375 bits per weight).
    IQ3_S,
    /// i-quant, super-blocks of 256 (2.5625 bits per weight).
    IQ2_S,
    /// Non-linear 4-bit codebook, super-blocks of 256 (4.25 bits per weight).
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// i-quant, super-blocks of 256 (1.75 bits per weight).
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, super-blocks of 256 (1.6875 bits per weight).
    TQ1_0,
    /// Ternary, super-blocks of 256 (2.0625 bits per weight).
    TQ2_0,
    /// Microscaling FP4 (E2M1), blocks of 32 with a shared 8-bit exponent (4.25 bits per
    /// weight).
    MXFP4,
}

/// (type, id, name, elements per block, bytes per block), from ggml's type traits.
const TABLE: &[(GgmlType, u32, &str, u64, u64)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, u64, u64) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every GgmlType has a table row")
    }

    /// The type for a raw id, or `None` for ids ggml does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The type for its ggml name (`"Q4_K"`), case-insensitive.
    pub fn from_name(name: &str) -> Option<Self> {
        TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }

    /// The type's ggml id, as stored in the tensor directory.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for the type, e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> u64 {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().4
    }

    /// Bytes for `n` elements, or `None` when `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Every type this crate knows.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
    }
}
