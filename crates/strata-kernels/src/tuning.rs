//! [`CudaTuning`]: every `STRATA_*` environment setting that steers the CUDA backend and the
//! model's decode steps, read once per process ([`CudaTuning::get`]).
//!
//! Only two kinds of setting belong here: limits measured on one GPU (an H200) that
//! another GPU may want elsewhere, and debugging aids that isolate a fault (graphs off,
//! cuBLASLt off, host gaps, kernel sources from disk). A switch that only turned a new
//! path off to compare it with the one before does not: once the new path is measured,
//! git history keeps the old one.
//!
//! `docs/cuda-tuning.md` is [`CudaTuning::doc_table`]'s output; a test keeps them equal.
//!
//! This module needs no CUDA (the model crate reads [`DecodeGraphs`] on every backend, and
//! the table's test runs everywhere).

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The measured defaults, shared with the CUDA modules that apply them.
pub(crate) mod defaults {
    pub const GEMV_MAX_ROWS: usize = 2;
    pub const DENSE_ATTENTION_MIN_Q: usize = 64;
    pub const SMALL_GEMM_MIN_ROWS: usize = 3;
    pub const SKINNY_GEMM_MAX_ROWS: usize = 128;
    pub const K_PARTS_MIN_ROWS: usize = 3;
    pub const K_PARTS_MAX_ROWS: usize = 256;
    pub const GATED_PAIR_MIN_ROWS: usize = 65;
    pub const GATED_PAIR_MAX_ROWS: usize = 256;
    pub const QUANT_GEMV_MAX_ROWS: usize = 8;
    pub const LORA_SPLIT_COLS: usize = 256;
}

/// How decode-only steps (every sequence feeds one token) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeGraphs {
    /// Op by op, each step shaped by its own batch (split counts from its own depths).
    Off,
    /// Captured once per batch-size bucket, then replayed (the default where the backend
    /// has graphs).
    Replay,
    /// The replayed step's exact shape (the padded bucket, the graph's tables and split
    /// counts) run op by op without capture: the same kernels on the same inputs, so a
    /// replay must give the same bits. Tells a capture or replay fault from a shape effect.
    Unrecorded,
}

/// One environment variable of [`CudaTuning`], for its table.
#[derive(Clone, Copy, Debug)]
pub struct TuningVariable {
    /// The variable's name (`STRATA_...`).
    pub name: &'static str,
    /// The default as the table shows it.
    pub default: &'static str,
    /// The field's doc comment.
    pub doc: &'static str,
}

// Parsers: an unset or unparsable value keeps the default (a typo never stops a server).
fn count(v: Option<&OsStr>, default: usize) -> usize {
    v.and_then(OsStr::to_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn on_unless_zero(v: Option<&OsStr>, default: bool) -> bool {
    match v.and_then(OsStr::to_str) {
        Some("0") => false,
        Some(_) => true,
        None => default,
    }
}

fn graphs(v: Option<&OsStr>, default: DecodeGraphs) -> DecodeGraphs {
    match v.and_then(OsStr::to_str) {
        Some("0") => DecodeGraphs::Off,
        Some("unrecorded") => DecodeGraphs::Unrecorded,
        Some(_) => DecodeGraphs::Replay,
        None => default,
    }
}

fn millis(v: Option<&OsStr>, default: Option<f64>) -> Option<f64> {
    v.and_then(OsStr::to_str)
        .and_then(|s| s.parse().ok())
        .or(default)
}

fn path(v: Option<&OsStr>, default: Option<PathBuf>) -> Option<PathBuf> {
    v.map(PathBuf::from).or(default)
}

/// Declares the struct, its defaults, its parsing and its table from one list, so that the
/// docs cannot name a variable the code does not read.
macro_rules! tuning {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $env:literal, default $default:expr, shown $shown:literal,
            parse $parse:ident;
    )*) => {
        /// The CUDA backend's and the decode steps' settings from the environment.
        #[derive(Clone, Debug, PartialEq)]
        pub struct CudaTuning {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for CudaTuning {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl CudaTuning {
            /// Every variable, in the struct's order.
            pub const VARIABLES: &'static [TuningVariable] = &[$(
                TuningVariable { name: $env, default: $shown, doc: concat!($($doc, "\n"),*) },
            )*];

            /// The settings `var` gives (`std::env::var_os` for the process's).
            pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Self {
                let d = Self::default();
                Self { $( $field: $parse(var($env).as_deref(), d.$field), )* }
            }

            /// `NAME=value` for each setting that differs from its default.
            pub fn changed(&self) -> Vec<String> {
                let d = Self::default();
                let mut out = Vec::new();
                $( if self.$field != d.$field {
                    out.push(format!("{}={:?}", $env, self.$field));
                } )*
                out
            }
        }
    };
}

tuning! {
    /// Rows up to which a bf16 matmul runs as the GEMV kernel (`kernels/gemv.cu`, at most 8;
    /// 0: never). Stays: where the GEMV stops beating the GEMMs depends on the GPU's
    /// bandwidth and tensor-core rate.
    gemv_max_rows: usize = "STRATA_GEMV_MAX_ROWS", default defaults::GEMV_MAX_ROWS,
        shown "2", parse count;
    /// Query rows from which a sequence's attention runs as a prefill (the tensor-core
    /// prefill kernel, or GEMMs; 0: never). Stays: the crossover with the paged decode
    /// kernel moves with the GPU.
    dense_attention_min_q: usize = "STRATA_DENSE_ATTENTION_MIN_Q",
        default defaults::DENSE_ATTENTION_MIN_Q, shown "64", parse count;
    /// The fewest rows a product of a small weight (one side at most 512) runs as
    /// `kernels/small_gemm.cu` (up to 128 rows; past 128 turns it off). Stays: a measured
    /// crossover with the GEMV and cuBLAS.
    small_gemm_min_rows: usize = "STRATA_SMALL_GEMM_MIN_ROWS",
        default defaults::SMALL_GEMM_MIN_ROWS, shown "3", parse count;
    /// The most rows a bf16 product runs as `kernels/skinny_gemm.cu` rather than cuBLAS
    /// (sm_90 and later; the device's tiles may allow fewer; 0 turns it off). Stays: a
    /// measured crossover with cuBLAS.
    skinny_gemm_max_rows: usize = "STRATA_SKINNY_GEMM_MAX_ROWS",
        default defaults::SKINNY_GEMM_MAX_ROWS, shown "128", parse count;
    /// The rows from which a product whose reader adds parts leaves the skinny GEMM for a
    /// batch split over k (`k_parts.rs`). Stays: a measured crossover.
    k_parts_min_rows: usize = "STRATA_K_PARTS_MIN_ROWS", default defaults::K_PARTS_MIN_ROWS,
        shown "3", parse count;
    /// The most rows a product is split over k (0 turns the split off). Stays: a measured
    /// crossover.
    k_parts_max_rows: usize = "STRATA_K_PARTS_MAX_ROWS", default defaults::K_PARTS_MAX_ROWS,
        shown "256", parse count;
    /// The fewest rows a gated product runs as one batched GEMM over gate and up
    /// (`gated_pair.rs`). Stays: a measured crossover with the skinny GEMM's tile.
    gated_pair_min_rows: usize = "STRATA_GATED_PAIR_MIN_ROWS",
        default defaults::GATED_PAIR_MIN_ROWS, shown "65", parse count;
    /// The most rows a gated product runs as that pair (0 turns it off). Stays: a measured
    /// crossover.
    gated_pair_max_rows: usize = "STRATA_GATED_PAIR_MAX_ROWS",
        default defaults::GATED_PAIR_MAX_ROWS, shown "256", parse count;
    /// Rows of activations up to which a product of GGUF blocks kept on the GPU runs as the
    /// block GEMV (`kernels/quant.cu`); past it the weight is decoded to a dense scratch for
    /// the GEMMs. 8 since the E2B Q4_K A/B of 2026-12-06: 2.6x at 16 rows, 4.9x at 32 over
    /// 32. Stays: the crossover moves with the GPU's bandwidth and the format.
    quant_gemv_max_rows: usize = "STRATA_QUANT_GEMV_MAX_ROWS",
        default defaults::QUANT_GEMV_MAX_ROWS, shown "8", parse count;
    /// Columns of x that one block of a LoRA shrink (`kernels/lora.cu`) sums, rounded up
    /// to a multiple of 8: fewer give a step of few rows more blocks, more leave the expand
    /// fewer parts to add. Stays: a balance measured on one GPU.
    lora_split_cols: usize = "STRATA_LORA_SPLIT_COLS", default defaults::LORA_SPLIT_COLS,
        shown "256", parse count;
    /// Whether the bf16 mode's products of GGUF blocks take x quantized to 8 bits with
    /// integer dot products (`kernels/quant_dp4a.cu`) rather than the weight decoded to f32
    /// (`0`). On since the model tests passed with it (2026-12-06, H100): 1.07x at one row,
    /// 1.9x at 8 on E2B Q4_K. Stays: a measured choice per GPU, and `0` gives the exact x.
    quant_dp4a: bool = "STRATA_QUANT_DP4A", default true, shown "on",
        parse on_unless_zero;
    /// Whether bf16 GEMMs run through cuBLASLt with per-bucket plans (`0`: every one as
    /// `cublasGemmEx`, as where cuBLASLt is missing). Stays: a debugging aid that tells a
    /// cuBLASLt fault from the rest, and exercises the fallback path.
    gemm_plans: bool = "STRATA_GEMM_PLANS", default true, shown "on", parse on_unless_zero;
    /// How decode steps run: captured and replayed as CUDA graphs (the default), `0` op by
    /// op, `unrecorded` the replayed shape op by op. Stays: a debugging aid that tells a
    /// capture or replay fault from the kernels'.
    cuda_graphs: DecodeGraphs = "STRATA_CUDA_GRAPHS", default DecodeGraphs::Replay,
        shown "replay", parse graphs;
    /// Reports on stderr every gap of at least this many ms between two device calls of a
    /// thread (`host_gaps.rs`). Stays: a profiling aid for host stalls, one cached read a
    /// call when unset.
    host_gaps_ms: Option<f64> = "STRATA_HOST_GAPS_MS", default None, shown "unset",
        parse millis;
    /// A directory whose `common.cuh` and `<name>.cu` replace the built-in kernel sources
    /// where present. Stays: kernel work without rebuilding (the cache keys on the text).
    kernel_dir: Option<PathBuf> = "STRATA_KERNEL_DIR", default None, shown "unset",
        parse path;
    /// Where compiled kernels are cached (else `$XDG_CACHE_HOME/strata/kernels`, else
    /// `~/.cache/strata/kernels`). Stays: deployments choose where the cache lives.
    kernel_cache: Option<PathBuf> = "STRATA_KERNEL_CACHE", default None, shown "unset",
        parse path;
}

impl CudaTuning {
    /// The process's settings, read from the environment the first time.
    pub fn get() -> &'static Self {
        static TUNING: OnceLock<CudaTuning> = OnceLock::new();
        TUNING.get_or_init(|| Self::from_vars(|name| std::env::var_os(name)))
    }

    /// One line for the start-up log: the settings that differ from their defaults.
    pub fn summary(&self) -> String {
        let changed = self.changed();
        if changed.is_empty() {
            "CUDA tuning: defaults".into()
        } else {
            format!("CUDA tuning: {}", changed.join(", "))
        }
    }

    /// `docs/cuda-tuning.md`: the variables as a Markdown table.
    pub fn doc_table() -> String {
        let mut s = String::from(
            "# CUDA tuning\n\n\
             <!-- Generated by `CudaTuning::doc_table` (crates/strata-kernels/src/tuning.rs); \
             regenerate with\n     \
             `STRATA_WRITE_DOCS=1 cargo test -p strata-kernels --lib tuning`. -->\n\n\
             The environment variables the CUDA backend and the decode steps read, once, at \
             start-up. A setting\nthat is not the default is logged when the backend starts. \
             An unset or unparsable value keeps the\ndefault.\n\n\
             | Variable | Default | What it does, and why it stays |\n\
             |---|---|---|\n",
        );
        for v in Self::VARIABLES {
            let doc: Vec<&str> = v.doc.lines().map(str::trim).collect();
            s.push_str(&format!(
                "| `{}` | {} | {} |\n",
                v.name,
                v.default,
                doc.join(" ").replace('|', "\\|")
            ));
        }
        s.push_str(
            "\nNot here: the test plumbing (`STRATA_REQUIRE_GPU`, `STRATA_TINY_FIXTURES`, \
             `STRATA_NVRTC_LIB`, `STRATA_MODELS`,\n`STRATA_WRITE_DOCS`) and the server's \
             settings (`STRATA_API_KEY`, `STRATA_ADMIN_API_KEY`: `strata-server --help`).\n\n\
             Switches that only turned a newer path off, to measure it against the one before, \
             were removed once\nthe newer path was measured (git history keeps them): \
             `STRATA_PAGED_MMA`, `STRATA_PREFILL_MMA`,\n`STRATA_PREFILL_SCALED_MMA`, \
             `STRATA_PREFILL_TWIN`, `STRATA_PREFILL_TOGETHER`, `STRATA_DECODE_MMA`,\n\
             `STRATA_DECODE_SCALED_MMA`, `STRATA_DECODE_SPAN`, `STRATA_DECODE_WINDOW_SPLITS`,\n\
             `STRATA_DECODE_VERIFY_BLOCKS`, `STRATA_GEMM_TUNE`, `STRATA_ARGMAX_SKIP`, \
             `STRATA_KV_SHARED_TRIM`,\n`STRATA_KV_SHARED_Q_PARTS`. `STRATA_SMALL_GEMM=0`, \
             `STRATA_SKINNY_GEMM=0`, `STRATA_K_PARTS=0` and\n`STRATA_GATED_PAIR=0` are now \
             the row limits above (`STRATA_SMALL_GEMM_MIN_ROWS=129`, a maximum of 0).\n",
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> CudaTuning {
        CudaTuning::from_vars(|name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn unset_or_unparsable_keeps_the_defaults() {
        assert_eq!(from(&[]), CudaTuning::default());
        assert_eq!(
            from(&[("STRATA_GEMV_MAX_ROWS", "two")]),
            CudaTuning::default()
        );
        assert!(from(&[]).changed().is_empty());
        assert_eq!(from(&[]).summary(), "CUDA tuning: defaults");
    }

    #[test]
    fn values_parse() {
        let t = from(&[
            ("STRATA_GEMV_MAX_ROWS", "4"),
            ("STRATA_GEMM_PLANS", "0"),
            ("STRATA_CUDA_GRAPHS", "unrecorded"),
            ("STRATA_HOST_GAPS_MS", "0.5"),
            ("STRATA_KERNEL_DIR", "/tmp/k"),
        ]);
        assert_eq!(t.gemv_max_rows, 4);
        assert!(!t.gemm_plans);
        assert_eq!(t.cuda_graphs, DecodeGraphs::Unrecorded);
        assert_eq!(t.host_gaps_ms, Some(0.5));
        assert_eq!(t.kernel_dir, Some(PathBuf::from("/tmp/k")));
        assert_eq!(
            from(&[("STRATA_CUDA_GRAPHS", "0")]).cuda_graphs,
            DecodeGraphs::Off
        );
        assert_eq!(
            from(&[("STRATA_CUDA_GRAPHS", "1")]).cuda_graphs,
            DecodeGraphs::Replay
        );
        assert!(from(&[("STRATA_GEMM_PLANS", "1")]).gemm_plans);
        assert_eq!(
            t.changed()[..2],
            ["STRATA_GEMV_MAX_ROWS=4", "STRATA_GEMM_PLANS=false"]
        );
    }

    #[test]
    fn every_variable_has_a_documented_reason() {
        for v in CudaTuning::VARIABLES {
            assert!(v.name.starts_with("STRATA_"), "{}", v.name);
            assert!(
                v.doc.contains("Stays:"),
                "{} does not say why it stays",
                v.name
            );
        }
    }

    /// `docs/cuda-tuning.md` is the table; `STRATA_WRITE_DOCS=1` rewrites it.
    #[test]
    fn docs_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cuda-tuning.md");
        let want = CudaTuning::doc_table();
        if std::env::var_os("STRATA_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).expect("writing docs/cuda-tuning.md");
            return;
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/cuda-tuning.md is out of date with CudaTuning; regenerate it with \
             `STRATA_WRITE_DOCS=1 cargo test -p strata-kernels --lib tuning`"
        );
    }
}
