//! Ops defined as another op in a different form: the `_idx` forms (inputs already in
//! backend memory), a graph batch rewritten by slots, and the host-side pick. Each must
//! give the bits of the form it is defined by, on the same backend.

use super::sampling::same_picks;
use super::{ctx, get, put, CheckResult, RowScaledQ8, TestData};
use crate::sampling::{draw_uniform, pick_rows, RowDraw, SamplingParams};
use crate::{AttentionParams, Backend, DType, PagedSeq, RopeParams, RopeStyle, StridedCopy};

/// Bit-for-bit equality of two downloads.
fn same_bits(what: &str, got: &[f32], want: &[f32]) -> CheckResult {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()));
    }
    match (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        Some(i) => Err(format!("{what}: value {i} is {}, want {}", got[i], want[i])),
        None => Ok(()),
    }
}

/// `rope_idx` as `rope`, `embedding_quant_idx` as `embedding_quant`, and a batch made with
/// other slots then rewritten by `paged_batch_update` as one made from the slots.
pub fn check_index_forms<B: Backend>(
    b: &B,
    prepare: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(900);

    // RoPE: 5 tokens of 3 heads of 64, positions far apart, both styles.
    let (t, heads, d) = (5, 3, 64);
    let x = data.normals(t * heads * d, 1.0, act);
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1e4f64.powf(-(2.0 * i as f64) / d as f64) as f32)
        .collect();
    let freqs = put(b, &inv, DType::F32)?;
    let positions = [0u32, 7, 300, 4096, 30_001];
    let pos_idx = ctx("rope_idx", b.upload_index(&positions))?;
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let p = RopeParams {
            n_heads: heads,
            head_dim: d,
            style,
        };
        let mut want = put(b, &x, act)?;
        ctx("rope", b.rope(&mut want, &positions, &freqs, p))?;
        let mut got = put(b, &x, act)?;
        ctx("rope_idx", b.rope_idx(&mut got, &pos_idx, &freqs, p))?;
        same_bits(
            &format!("rope_idx {style:?}"),
            &get(b, &got)?,
            &get(b, &want)?,
        )?;
    }

    // Quantized embedding: 9 ids (repeats, first and last row) of a 30 x 64 table.
    let (vocab, hidden) = (30, 64);
    let q = RowScaledQ8::quantize(
        &data.normals(vocab * hidden, 1.0, DType::F32),
        vocab,
        hidden,
    );
    let table = prepare(&q);
    let ids = [0u32, 29, 3, 3, 17, 0, 8, 22, 29];
    let mut want = ctx("embedding_quant", b.zeros(ids.len() * hidden, act))?;
    ctx(
        "embedding_quant",
        b.embedding_quant(&ids, &table, 8.0, &mut want),
    )?;
    let id_idx = ctx("embedding_quant_idx", b.upload_index(&ids))?;
    let mut got = ctx("embedding_quant_idx", b.zeros(ids.len() * hidden, act))?;
    ctx(
        "embedding_quant_idx",
        b.embedding_quant_idx(&id_idx, &table, 8.0, &mut got),
    )?;
    same_bits("embedding_quant_idx", &get(b, &got)?, &get(b, &want)?)?;

    check_update_by_slots(b, &mut data)
}

/// A graph batch made with zero slots, then rewritten by `paged_batch_update` (a decode
/// row with a window and a 3-row chunk over scattered slots), attends with the bits of a
/// batch made from those slots at the same capacity.
fn check_update_by_slots<B: Backend>(b: &B, data: &mut TestData) -> CheckResult {
    const WHAT: &str = "paged_batch_update";
    let act = b.activation_dtype();
    let d = 64;
    let slab = super::paged::random_slab(b, data, WHAT, 64, d)?;
    // Sequence 0: 20 keys, one query row, a window of 8 (keys 12..20); sequence 1: 10
    // keys, 3 query rows.
    let seqs = [
        PagedSeq {
            q_offset: 0,
            q_len: 1,
            q_start: 19,
            k_start: 12,
            slot_offset: 0,
        },
        PagedSeq {
            q_offset: 1,
            q_len: 3,
            q_start: 7,
            k_start: 0,
            slot_offset: 8,
        },
    ];
    let slots: Vec<u32> = (0..18u32).map(|i| (i * 37 + 5) % 64).collect();
    let p = AttentionParams {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: d,
        scale: 0.125,
        window: Some(8),
        causal: true,
        softcap: None,
    };
    let rows = 4;
    let q = put(b, &data.normals(rows * 2 * d, 1.0, act), act)?;
    let capacity = 2 * slots.len();
    let made = ctx(WHAT, b.paged_batch_with_capacity(&seqs, &slots, capacity))?;
    let mut want = ctx(WHAT, b.zeros(rows * 2 * d, act))?;
    ctx(WHAT, b.paged_attention(&q, &slab, &made, p, &mut want))?;
    let mut updated = ctx(
        WHAT,
        b.paged_batch_with_capacity(&seqs, &vec![0; slots.len()], capacity),
    )?;
    ctx(WHAT, b.paged_batch_update(&mut updated, &seqs, &slots))?;
    let mut got = ctx(WHAT, b.zeros(rows * 2 * d, act))?;
    ctx(WHAT, b.paged_attention(&q, &slab, &updated, p, &mut got))?;
    same_bits(WHAT, &get(b, &got)?, &get(b, &want)?)
}

/// `capped_rows` as a download of the logits (softcapped by the backend's own `softcap`
/// on a copy where a cap is given, the logits left raw), and `pick_on_host` as the host
/// sampler's `pick_rows` over those values, greedy and drawn rows, with logprobs.
pub fn check_host_pick<B: Backend>(b: &B) -> CheckResult {
    // Logits are f32 whatever the activations are (as the default `capped_rows` assumes).
    let act = DType::F32;
    let mut data = TestData::new(901);
    let (vocab, rows) = (1000, 5);
    // One row more than asked for: the functions read only the first `rows`.
    let logits = data.normals((rows + 1) * vocab, 4.0, act);
    let lb = put(b, &logits, act)?;
    let n = rows * vocab;
    let raw = get(b, &lb)?;
    let drawn = [1, 3].map(|row| RowDraw {
        row,
        params: SamplingParams {
            temperature: 2.0,
            ..SamplingParams::greedy()
        },
        uniform: draw_uniform(5, row as u64),
        logprobs: (row == 3).then_some(4),
    });
    for cap in [None, Some(3.0f32)] {
        let want = match cap {
            None => raw[..n].to_vec(),
            Some(cap) => {
                let mut c = ctx("capped_rows", b.zeros(n, act))?;
                let whole = StridedCopy {
                    rows: 1,
                    cols: n,
                    src_offset: 0,
                    src_stride: 0,
                    dst_offset: 0,
                    dst_stride: 0,
                };
                ctx("capped_rows", b.copy_strided(&lb, &mut c, whole))?;
                ctx("capped_rows", b.softcap(&mut c, cap))?;
                get(b, &c)?
            }
        };
        let got = ctx("capped_rows", b.capped_rows(&lb, n, cap))?;
        same_bits(&format!("capped_rows cap {cap:?}"), &got, &want)?;
        if get(b, &lb)? != raw {
            return Err(format!("capped_rows cap {cap:?} changed the logits"));
        }
        let picked = ctx(
            "pick_on_host",
            b.pick_on_host(&lb, vocab, rows, cap, &drawn),
        )?;
        let host = pick_rows(&want, vocab, rows, &drawn).map_err(|e| e.to_string())?;
        if !same_picks(&picked, &host) {
            return Err(format!(
                "pick_on_host cap {cap:?}: {picked:?}, the host's {host:?}"
            ));
        }
    }
    Ok(())
}
