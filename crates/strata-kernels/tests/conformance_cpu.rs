//! The shared conformance checks, run on the CPU backend: one test a case of the shared
//! list (`conformance_tests!`, the same list every backend runs), `check_all` on a
//! single-thread pool, and property tests over random shapes.

use proptest::prelude::*;
use strata_kernels::conformance::{self, *};
use strata_kernels::cpu::CpuBackend;
use strata_kernels::{Activation, DType, RopeStyle, RowDot};

fn cpu() -> CpuBackend {
    CpuBackend::new()
}

fn boxed(q: &RowScaledQ8) -> Box<dyn RowDot> {
    Box::new(q.clone())
}

strata_kernels::conformance_tests! {
    backend: Some(cpu()),
    quant: boxed,
}

#[test]
fn check_all_on_a_private_single_thread_pool() {
    let b = CpuBackend::with_threads(1).unwrap();
    conformance::check_all(&b, &boxed).unwrap();
}

fn weight_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::BF16), Just(DType::F16)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matmul_random_shapes(
        tokens in 1usize..12, in_features in 1usize..200, out_features in 1usize..80,
        weight in weight_dtype(), seed in any::<u64>(),
    ) {
        let c = MatmulCase { tokens, in_features, out_features, weight, seed };
        check_matmul_case(&cpu(), c).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn matmul_quant_random_shapes(
        tokens in 1usize..10, in_features in 1usize..100, out_features in 1usize..40,
        seed in any::<u64>(),
    ) {
        let c = MatmulCase { tokens, in_features, out_features, weight: DType::F32, seed };
        check_matmul_quant_case(&cpu(), c, &boxed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn rms_norm_random_shapes(
        rows in 1usize..10, dim in 1usize..600, weight in proptest::option::of(weight_dtype()),
        offset in prop_oneof![Just(0.0f32), Just(1.0f32)],
        variant in prop_oneof![Just(NormVariant::Plain), Just(NormVariant::AddThenNorm), Just(NormVariant::NormThenAdd)],
        seed in any::<u64>(),
    ) {
        let c = RmsNormCase { rows, dim, weight, weight_offset: offset, eps: 1e-6, variant, seed };
        check_rms_norm_case(&cpu(), c).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn rope_random_shapes(
        tokens in 1usize..6, n_heads in 1usize..5, half in 1usize..80, rotated_frac in 0.0f64..=1.0,
        interleaved in any::<bool>(), max_position in 1u32..50_000, seed in any::<u64>(),
    ) {
        let c = RopeCase {
            tokens, n_heads, head_dim: 2 * half,
            rotated_pairs: (rotated_frac * half as f64) as usize,
            theta: 1e4,
            style: if interleaved { RopeStyle::Interleaved } else { RopeStyle::Neox },
            max_position, seed,
        };
        check_rope_case(&cpu(), c).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn attention_random_shapes(
        q_tokens in 1usize..6, cached in 0usize..24, first_position in 0u32..1000,
        kv_heads in 1usize..3, group in 1usize..4,
        head_dim in prop_oneof![Just(64usize), Just(128), Just(256), Just(512), 1usize..40],
        window in proptest::option::of(1usize..12), causal in prop::bool::weighted(0.8),
        softcap in proptest::option::of(5.0f32..60.0), shuffle_keys in any::<bool>(),
        unit_scale in any::<bool>(), seed in any::<u64>(),
    ) {
        let c = AttentionCase {
            q_tokens, cached, first_position, n_heads: kv_heads * group, n_kv_heads: kv_heads,
            head_dim, window, causal,
            scale: if unit_scale { 1.0 } else { 1.0 / (head_dim as f32).sqrt() },
            softcap, shuffle_keys, seed,
        };
        check_attention_case(&cpu(), c).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn act_mul_random_lengths(len in 1usize..5000, spread in 0.1f32..20.0, silu in any::<bool>(), seed in any::<u64>()) {
        let act = if silu { Activation::Silu } else { Activation::GeluTanh };
        check_act_mul_case(&cpu(), act, ElementwiseCase { len, spread, seed }).map_err(TestCaseError::fail)?;
    }
}

fn kv_format() -> impl Strategy<Value = strata_kernels::KvFormat> {
    proptest::sample::select(ALL_FORMATS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn paged_attention_random_shapes(
        format in kv_format(), kv_heads in 1usize..3, group in 1usize..5,
        d32 in 1usize..17, window in proptest::option::of(1usize..40),
        seqs in proptest::collection::vec((0usize..60, 1usize..9), 1..4), seed in any::<u64>(),
    ) {
        let c = PagedCase {
            format, n_heads: kv_heads * group, n_kv_heads: kv_heads, head_dim: 32 * d32,
            window, scale: 1.0 / (32.0 * d32 as f32).sqrt(), softcap: None, seqs, seed,
        };
        check_paged_attention_case(&cpu(), &c).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn kv_store_random_shapes(
        format in kv_format(), heads in 1usize..4, d in 1usize..600, rows in 1usize..20,
        seed in any::<u64>(),
    ) {
        check_kv_store_case(&cpu(), format, heads, d, rows, seed).map_err(TestCaseError::fail)?;
    }
}
