//! The conformance cases as one table, read three ways: the per-backend tests
//! ([`crate::conformance_tests!`] expands to one `#[test]` a case), the method registry
//! ([`CASES`]: which [`Backend`] methods each case calls, so a method without a case fails
//! a test) and [`run_case`] (what [`super::check_all`] and the `op_timings` example run).
//!
//! Adding an op: write its `check_<op>(backend)` in a family file, then add one line to the
//! table in [`crate::conformance_tests!`]; every backend's test file picks it up.

use super::{CheckResult, RowScaledQ8};
use crate::Backend;

/// One conformance case: its name (the test's name in every backend's test file) and the
/// [`Backend`] methods it calls directly, each checked against a reference.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The case's name: its `#[test]` function and its key for [`run_case`].
    pub name: &'static str,
    /// The [`Backend`] methods it calls and checks.
    pub methods: &'static [&'static str],
}

/// [`Backend`] methods with no conformance case, each with the reason. Every other trait
/// method must appear in some case's `methods` (the registry test below enforces it).
pub const NOT_OPS: &[(&str, &str)] = &[
    ("name", "a label for logs, no values to check"),
    (
        "activation_dtype",
        "a property; every case reads it to pick its tolerance",
    ),
    (
        "scratch",
        "an allocation whose contents are unspecified; nothing to compare",
    ),
    (
        "matmul_k_parts",
        "a planning query (how many parts a product gains from); matmul_parts, which runs them, is in k_parts",
    ),
    (
        "supports_graphs",
        "graph capture is replay machinery, not an op; strata-model's decode-graph tests replay steps bit for bit against op-by-op runs",
    ),
    ("begin_capture", "see supports_graphs"),
    ("end_capture", "see supports_graphs"),
    ("launch_graph", "see supports_graphs"),
];

/// Expands, for one backend, into one `#[test]` per conformance case:
///
/// ```ignore
/// strata_kernels::conformance_tests! {
///     backend: Some(CpuBackend::new()),        // Option<B>: None skips every case
///     quant: |q: &RowScaledQ8| -> Box<dyn RowDot> { Box::new(q.clone()) },
/// }
/// ```
///
/// `backend` is evaluated once a test, so a GPU file passes a helper that prints
/// `skipped: no GPU` and returns `None` where none starts. `quant` turns the reference
/// quantized matrix into the backend's quantized form. Each check picks its tolerance from
/// the backend's activation dtype, so the macro sets none.
///
/// The table below is the one list of cases: each line is the test name, whether the
/// check takes the quantizer (`quant`) or not (`plain`), the check function in
/// [`crate::conformance`] and the [`crate::Backend`] methods it calls.
#[macro_export]
macro_rules! conformance_tests {
    (backend: $backend:expr, quant: $quant:expr $(,)?) => {
        $crate::conformance_tests!(@table tests ($backend, $quant));
    };
    (@table $arm:ident $args:tt) => {
        $crate::conformance_tests!(@$arm $args
            upload_download plain check_upload_download ["upload", "upload_f32_as", "download", "zeros"];
            copy_strided plain check_copy_strided ["copy_strided"];
            embedding plain check_embedding ["embedding"];
            embedding_quant quant check_embedding_quant ["embedding_quant"];
            rms_norm plain check_rms_norm ["rms_norm", "residual_norm"];
            rope plain check_rope ["rope"];
            matmul plain check_matmul ["matmul"];
            fused_matmuls plain check_fused_matmuls ["matmul_shared_input", "gated_matmul", "gated_slice_matmul"];
            matmul_quant quant check_matmul_quant ["matmul_quant"];
            fused_matmuls_quant quant check_fused_matmuls_quant ["matmul_quant_shared_input", "gated_matmul_quant"];
            lora_bgmv plain check_lora_bgmv ["lora_bgmv"];
            lora_shared plain check_lora_shared_input ["lora_bgmv_shared_input"];
            act_mul plain check_act_mul ["act_mul"];
            activation plain check_activation ["activation"];
            softcap plain check_softcap ["softcap"];
            clamp plain check_clamp ["clamp"];
            depthwise_conv plain check_depthwise_conv ["depthwise_conv1d_causal"];
            chunked_attention plain check_chunked_attention ["chunked_attention"];
            arith plain check_arith ["add", "mul", "scale"];
            attention plain check_attention ["attention"];
            paged plain check_paged ["kv_slab", "kv_slab_contents", "kv_store", "upload_index", "paged_batch", "paged_batch_with_capacity", "paged_batch_update_pages", "paged_attention"];
            sample plain check_sample ["pick_start", "pick_finish"];
            argmax plain check_argmax ["argmax_rows"];
            clustered_argmax plain check_clustered_argmax ["clustered_argmax", "download_index"];
            feed_tokens plain check_feed_tokens ["feed_tokens", "embedding_idx", "write_index"];
            adjust_logits plain check_adjust_logits ["adjust_logits"];
            mask_logits plain check_mask_logits ["mask_logits"];
            fused plain check_fused ["residual_norm", "head_norm_rope_idx", "qkv_norm_rope_idx", "qkv_norm_rope_store_idx", "act_mul_slice"];
            k_parts plain check_k_parts ["matmul_parts", "head_norm_rope_parts_idx"];
            index_forms quant check_index_forms ["rope_idx", "embedding_quant_idx", "paged_batch_update"];
            host_pick plain check_host_pick ["capped_rows", "pick_on_host"];
        );
    };
    (@tests ($backend:expr, $quant:expr)
        $($name:ident $kind:ident $check:ident [$($method:literal),*];)*) => {
        $(
            #[test]
            fn $name() {
                let Some(b) = $backend else { return };
                let r: $crate::conformance::CheckResult =
                    $crate::conformance_tests!(@call $kind $check, &b, &$quant);
                if let Err(e) = r {
                    panic!("{}: {e}", stringify!($name));
                }
            }
        )*
    };
    (@registry ()
        $($name:ident $kind:ident $check:ident [$($method:literal),*];)*) => {
        /// Every conformance case, in the order [`check_all`](super::check_all) runs them.
        pub const CASES: &[Case] = &[
            $(Case { name: stringify!($name), methods: &[$($method),*] },)*
        ];

        /// Runs the case called `name` on `b` (`None`: no such case).
        pub fn run_case<B: Backend>(
            name: &str,
            b: &B,
            quant: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
        ) -> Option<CheckResult> {
            match name {
                $(stringify!($name) => Some($crate::conformance_tests!(@call $kind $check, b, quant)),)*
                _ => None,
            }
        }
    };
    (@call plain $check:ident, $b:expr, $quant:expr) => {
        $crate::conformance::$check($b)
    };
    (@call quant $check:ident, $b:expr, $quant:expr) => {
        $crate::conformance::$check($b, $quant)
    };
}

crate::conformance_tests!(@table registry ());

#[cfg(test)]
mod tests {
    use super::*;

    /// The method names declared in `pub trait Backend { ... }` of `src`: a line-based
    /// scan of the trait body for `fn name` at the trait's own indentation.
    fn trait_methods(src: &str) -> Vec<&str> {
        let start = src
            .find("pub trait Backend")
            .expect("backend.rs declares pub trait Backend");
        let body = &src[start..];
        let end = body.find("\n}").expect("the trait block ends");
        body[..end]
            .lines()
            .filter_map(|l| l.strip_prefix("    fn "))
            .map(|l| l.split(['(', '<']).next().unwrap().trim())
            .collect()
    }

    /// Fails when a `Backend` method has no conformance case: add a case (or a method to an
    /// existing case's list, where its check calls it) in `conformance_tests!`, or, for a
    /// method that is not an op, an entry with its reason in [`NOT_OPS`].
    #[test]
    fn every_backend_method_has_a_case() {
        let methods = trait_methods(include_str!("../backend.rs"));
        assert!(methods.len() > 40, "the scan found only {methods:?}");
        let covered = |m: &str| CASES.iter().any(|c| c.methods.contains(&m));
        let allowed = |m: &str| NOT_OPS.iter().any(|&(n, _)| n == m);
        let missing: Vec<_> = methods
            .iter()
            .filter(|m| !covered(m) && !allowed(m))
            .collect();
        assert!(
            missing.is_empty(),
            "Backend methods without a conformance case: {missing:?}"
        );
        // Names in the registry that are not trait methods are stale.
        let named = CASES
            .iter()
            .flat_map(|c| c.methods.iter())
            .chain(NOT_OPS.iter().map(|(n, _)| n));
        let stale: Vec<_> = named.filter(|m| !methods.contains(m)).collect();
        assert!(stale.is_empty(), "not Backend methods: {stale:?}");
        let both: Vec<_> = NOT_OPS.iter().filter(|(n, _)| covered(n)).collect();
        assert!(both.is_empty(), "allow-listed yet in a case: {both:?}");
    }

    #[test]
    fn case_names_are_unique_and_runnable() {
        let cpu = crate::cpu::CpuBackend::new();
        for (i, c) in CASES.iter().enumerate() {
            assert!(
                CASES[..i].iter().all(|d| d.name != c.name),
                "{} twice",
                c.name
            );
        }
        let quant = |q: &RowScaledQ8| -> Box<dyn crate::RowDot> { Box::new(q.clone()) };
        assert!(run_case("no_such_case", &cpu, &quant).is_none());
    }
}
