//! How a paged attention call runs: a pure function of the batch's sequences, the
//! attention's shape and the backend's limits, so that `paged_attention_impl` only checks
//! its buffers and launches, and the choice's boundaries are tested without a GPU.

use super::paged::{short_row_span, tokens_per_block, MAX_SPLITS, MIN_SPLIT_KEYS};
use super::paged_mma::{self, MmaSupport};
use crate::{AttentionParams, KvFormat, PagedSeq};

/// The call: its sequences (rows in order), its rows, whether its batch is a graph's (a
/// decode step: made with a capacity), the slab's format and the attention's shape.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttentionCall<'a> {
    pub seqs: &'a [PagedSeq],
    pub rows: usize,
    pub graph: bool,
    pub format: KvFormat,
    pub p: &'a AttentionParams,
}

/// The backend's side of the choice.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttentionLimits<'a> {
    /// The bf16 speed mode.
    pub bf16_gemm: bool,
    /// The GEMV's rows: past them the o projection reads a bf16 operand.
    pub gemv_max_rows: usize,
    /// Query rows from which a sequence runs as a prefill (0: never).
    pub dense_min_q: usize,
    pub sm_count: usize,
    pub mma: &'a MmaSupport,
}

/// The decode kernel's launch over the call's short rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DecodeLaunch {
    /// The tensor-core kernel `kernel` (else the CUDA-core `paged_attention`).
    pub mma: bool,
    pub kernel: &'static str,
    /// Its dynamic shared memory (0 for the CUDA-core kernel).
    pub smem: usize,
    /// The rows the grid covers: `row0 .. row0 + span`.
    pub row0: usize,
    pub span: usize,
    /// Query tokens a block takes (a verification's tokens of a sequence), and key splits.
    pub tokens_per_block: usize,
    pub splits: usize,
}

/// What a paged attention call launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AttentionPlan {
    /// The prefill threshold this call uses (0 in a graph's batch).
    pub dense_min_q: usize,
    /// Whether the launches write the output's bf16 twin too.
    pub twin: bool,
    /// The decode kernel's launch; `None` when every row is a long run's.
    pub decode: Option<DecodeLaunch>,
    /// Whether the long runs then run as prefills (`dense_sequences`).
    pub prefill: bool,
}

impl AttentionPlan {
    pub(super) fn choose(c: AttentionCall<'_>, l: AttentionLimits<'_>) -> Self {
        let p = c.p;
        let d = p.head_dim;
        // Graph batches are decode steps: never the prefill path.
        let dense_min_q = if c.graph { 0 } else { l.dense_min_q };
        let mma = l.mma.applies(l.bf16_gemm, c.format, p);
        let all_long = dense_min_q > 0 && c.seqs.iter().all(|s| s.q_len >= dense_min_q);
        let any_long = dense_min_q > 0 && c.seqs.iter().any(|s| s.q_len >= dense_min_q);
        // The o projection's bf16 GEMM reads the result next: the tensor-core kernels and
        // the combine write its bf16 twin as well, if every path of this call is theirs
        // (the CUDA-core kernel and the GEMM path do not write one).
        let twin = l.bf16_gemm
            && c.rows > l.gemv_max_rows
            && (all_long || mma)
            && (!any_long || l.mma.prefill_applies(l.bf16_gemm, c.format, p));
        if all_long {
            // Every row is a long query run's (a prefill): the paged kernel would only
            // launch blocks that find no keys.
            return Self {
                dense_min_q,
                twin,
                decode: None,
                prefill: true,
            };
        }
        // Beside long runs (a step that admits prompts while others decode) the tensor-core
        // kernels take only the span of rows from the first short sequence to the last: a
        // grid over every row would size its splits by the prompts' rows, whose blocks find
        // no keys, and leave the decode rows one split each.
        let (row0, span) = if mma && any_long {
            short_row_span(c.seqs, dense_min_q)
        } else {
            (0, c.rows)
        };
        let tasks = span * p.n_heads;
        let max_keys = c.seqs.iter().map(|s| s.k_len()).max().unwrap_or(0);
        let (mma_kernel, mma_smem) = l.mma.decode_kernel(d, c.format);
        // Split the keys when there are too few blocks to fill the GPU. The tensor-core
        // kernel serves a KV head's whole query group per block and holds a multiprocessor's
        // shared memory, so it sizes its grid to one wave of resident blocks.
        let (tpb, splits) = if mma {
            let resident = l.mma.resident_blocks(d, c.format, l.sm_count);
            let most = if c.graph {
                paged_mma::graph_split_cap(p.window, MAX_SPLITS)
            } else {
                max_keys.div_ceil(MIN_SPLIT_KEYS).clamp(1, MAX_SPLITS)
            };
            // The FlashAttention-2 layout's kernels can take a verification's tokens of a
            // sequence in one block, which reads its keys once for all of them. That leaves
            // fewer blocks, so only where they still fill a wave with the splits allowed.
            let tpb = if mma_kernel != paged_mma::KERNEL && span == c.rows {
                tokens_per_block(
                    c.seqs,
                    p.n_heads / p.n_kv_heads,
                    p.n_kv_heads * most,
                    resident,
                )
            } else {
                1
            };
            let blocks = span / tpb * p.n_kv_heads;
            (tpb, paged_mma::wave_splits(blocks, resident, most))
        } else {
            let target = 2 * l.sm_count;
            let splits = if tasks >= target {
                1
            } else if c.graph {
                target.div_ceil(tasks).clamp(1, MAX_SPLITS)
            } else {
                target
                    .div_ceil(tasks)
                    .min(max_keys.div_ceil(MIN_SPLIT_KEYS))
                    .clamp(1, MAX_SPLITS)
            };
            (1, splits)
        };
        Self {
            dense_min_q,
            twin,
            decode: Some(DecodeLaunch {
                mma,
                kernel: if mma { mma_kernel } else { "paged_attention" },
                smem: if mma { mma_smem } else { 0 },
                row0,
                span,
                tokens_per_block: tpb,
                splits,
            }),
            prefill: any_long,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200's grants with every tensor-core kernel.
    const H200: MmaSupport = MmaSupport {
        smem_limit: 227 * 1024,
        smem_per_sm: 228 * 1024,
        prefill_smem_limit: 227 * 1024,
        decode_fa: true,
        decode_scaled: true,
        prefill_scaled: true,
    };
    const NONE: MmaSupport = MmaSupport {
        smem_limit: 0,
        smem_per_sm: 0,
        prefill_smem_limit: 0,
        decode_fa: false,
        decode_scaled: false,
        prefill_scaled: false,
    };

    /// Gemma-4 E2B's sliding layers: 8 query heads over 1 KV head of 256.
    const P: AttentionParams = AttentionParams {
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 256,
        scale: 1.0,
        window: Some(512),
        causal: true,
        softcap: None,
    };

    fn limits(mma: &MmaSupport) -> AttentionLimits<'_> {
        AttentionLimits {
            bf16_gemm: true,
            gemv_max_rows: 2,
            dense_min_q: 64,
            sm_count: 132,
            mma,
        }
    }

    /// Sequences of `q_lens` query rows after `past` keys each, rows in order.
    fn seqs(q_lens: &[usize], past: usize) -> Vec<PagedSeq> {
        let mut at = 0;
        q_lens
            .iter()
            .map(|&q_len| {
                let s = PagedSeq {
                    q_offset: at,
                    q_len,
                    q_start: past,
                    k_start: 0,
                    slot_offset: 0,
                };
                at += q_len;
                s
            })
            .collect()
    }

    fn plan(q_lens: &[usize], past: usize, graph: bool, l: AttentionLimits<'_>) -> AttentionPlan {
        let s = seqs(q_lens, past);
        let call = AttentionCall {
            seqs: &s,
            rows: q_lens.iter().sum(),
            graph,
            format: KvFormat::Bf16,
            p: &P,
        };
        AttentionPlan::choose(call, l)
    }

    #[test]
    fn a_prefill_alone_skips_the_decode_kernel() {
        let got = plan(&[64, 100], 0, false, limits(&H200));
        assert_eq!(got.decode, None);
        assert!(got.prefill && got.twin);
        // One row short of the threshold: the decode kernel takes the call.
        let got = plan(&[63], 0, false, limits(&H200));
        assert!(!got.prefill && got.decode.is_some());
        // A graph's batch never prefills.
        let got = plan(&[64], 0, true, limits(&H200));
        assert_eq!((got.dense_min_q, got.prefill), (0, false));
        assert_eq!(got.decode.unwrap().span, 64);
        // Nor does a backend whose threshold is 0.
        let off = AttentionLimits {
            dense_min_q: 0,
            ..limits(&H200)
        };
        assert!(!plan(&[4096], 0, false, off).prefill);
    }

    #[test]
    fn decode_rows_beside_prompts_take_their_span_alone() {
        let got = plan(&[100, 1, 1, 200, 1], 1000, false, limits(&H200));
        let decode = got.decode.unwrap();
        assert!(decode.mma && got.prefill);
        // From the first short row (100) to the end of the last (302 + 1).
        assert_eq!((decode.row0, decode.span), (100, 203));
        assert_eq!(decode.tokens_per_block, 1, "not every row: a block a row");
        // Without the tensor-core kernel the grid covers every row.
        let got = plan(&[100, 1, 1, 200, 1], 1000, false, limits(&NONE));
        let decode = got.decode.unwrap();
        assert_eq!((decode.mma, decode.row0, decode.span), (false, 0, 303));
        assert_eq!(decode.kernel, "paged_attention");
        assert!(!got.twin, "the CUDA-core kernel writes no twin");
    }

    #[test]
    fn splits_fill_a_wave() {
        // One decode row of E2B at 4096 keys: one block a KV head, so the splits fill the
        // resident blocks (two d-256 blocks on each of 132 multiprocessors), capped by the
        // keys (16 splits of 256).
        let decode = plan(&[1], 4095, false, limits(&H200)).decode.unwrap();
        assert_eq!(decode.kernel, "decode_attention_mma_d256");
        assert_eq!(decode.splits, 16);
        // Short keys: one split.
        let decode = plan(&[1], 10, false, limits(&H200)).decode.unwrap();
        assert_eq!(decode.splits, 1);
        // A graph step sizes its splits by the window (512 keys), not this step's keys.
        let graph = plan(&[1], 10, true, limits(&H200)).decode.unwrap();
        assert_eq!(
            graph.splits,
            paged_mma::graph_split_cap(P.window, MAX_SPLITS)
        );
        // The CUDA-core kernel: a block a (row, head) and splits up to twice the
        // multiprocessors' worth of tasks, capped by the keys.
        let decode = plan(&[1], 4095, false, limits(&NONE)).decode.unwrap();
        assert_eq!(decode.splits, 16);
        let decode = plan(&[40; 8], 100_000, false, limits(&NONE))
            .decode
            .unwrap();
        assert_eq!(decode.splits, 1, "320 rows of 8 heads fill the GPU");
    }

    #[test]
    fn a_verification_shares_blocks() {
        // 40 sequences verifying 2 tokens each (2 x 8 query heads fit the 16-row mma) at
        // 2000 keys: 8 splits a sequence still fill the 264 resident blocks.
        let decode = plan(&[2; 40], 2000, false, limits(&H200)).decode.unwrap();
        assert_eq!(decode.tokens_per_block, 2);
        // At 4 sequences a block a token keeps the GPU full.
        let decode = plan(&[2; 4], 2000, false, limits(&H200)).decode.unwrap();
        assert_eq!(decode.tokens_per_block, 1);
        // Without the FlashAttention-2 layout kernel: a block a token.
        let old = MmaSupport {
            decode_fa: false,
            ..H200
        };
        let decode = plan(&[2; 40], 2000, false, limits(&old)).decode.unwrap();
        assert_eq!(
            (decode.kernel, decode.tokens_per_block),
            (paged_mma::KERNEL, 1)
        );
    }

    #[test]
    fn the_twin_needs_a_gemm_reader_and_every_path_writing_it() {
        // Two decode rows: the o projection runs as the GEMV (f32), no twin.
        assert!(!plan(&[1, 1], 100, false, limits(&H200)).twin);
        assert!(plan(&[1, 1, 1], 100, false, limits(&H200)).twin);
        let exact = AttentionLimits {
            bf16_gemm: false,
            ..limits(&H200)
        };
        assert!(!plan(&[1, 1, 1], 100, false, exact).twin);
    }
}
