//! The backend's sampler against the host definition in [`crate::sampling`].

use super::{ctx, put, CheckResult, TestData};
use crate::sampling::{sample_rows, SamplerRng, SamplingParams};
use crate::Backend;

pub fn check_sample<B: Backend>(b: &B) -> CheckResult {
    let vocab = 1000;
    let mut data = TestData::new(800);
    let greedy = SamplingParams::greedy();
    let warm = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: None,
    };
    let params = [
        greedy,
        warm(1.0, 0, 1.0, 0.0),
        warm(0.7, 40, 1.0, 0.0),
        warm(0.8, 0, 0.9, 0.0),
        warm(1.2, 0, 1.0, 0.05),
        warm(0.6, 50, 0.95, 0.02),
    ];
    let logits: Vec<f32> = (0..params.len() * vocab)
        .map(|_| data.normal() * 3.0)
        .collect();
    let lb = put(b, &logits, b.activation_dtype())?;
    // The reference sees the logits as the backend stores them.
    let stored = b.download(&lb).map_err(|e| e.to_string())?;
    for step in 0..20u64 {
        let mut rngs: Vec<SamplerRng> = (0..params.len())
            .map(|i| SamplerRng::new(step * 31 + i as u64))
            .collect();
        let mut ref_rngs = rngs.clone();
        let got = b
            .sample(&lb, vocab, &params, &mut rngs)
            .map_err(|e| e.to_string())?;
        let want =
            sample_rows(&stored, vocab, &params, &mut ref_rngs).map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!("sample step {step}: got {got:?}, want {want:?}"));
        }
        if rngs != ref_rngs {
            return Err(format!("sample step {step}: rng streams diverged"));
        }
    }
    Ok(())
}

/// Greedy choice where the logits are: equal to the host `argmax` on rows with ties (the
/// lowest id wins), NaN (never chosen), all -inf (id 0), at the real vocabulary size, and
/// over only the first rows of a larger buffer; with a softcap, the argmax of the
/// backend's own softcapped values, the logits left as they were.
pub fn check_argmax<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(801);
    // 7 and 4099: not a multiple of four (the GPU's one-value loads); 1000: 16-byte loads,
    // the tail loop alone; 65,540: the unrolled loads and a tail; 262,144: the vocabulary.
    for vocab in [7usize, 1000, 4099, 65_540, 262_144] {
        let rows = 5;
        let mut logits: Vec<f32> = (0..rows * vocab).map(|_| data.normal() * 3.0).collect();
        // Row 1: a tie between two ids for the maximum; row 2: NaNs; row 3: all -inf.
        let top = 100.0;
        logits[vocab + vocab / 2] = top;
        logits[vocab + vocab / 3] = top;
        for i in (0..vocab).step_by(3) {
            logits[2 * vocab + i] = f32::NAN;
        }
        logits[3 * vocab..4 * vocab].fill(f32::NEG_INFINITY);
        let lb = put(b, &logits, b.activation_dtype())?;
        // Capped at 30 (Gemma's final softcap): the two 100s stay tied, and the order of
        // the rest is the capped values' (checked against the backend's own softcap).
        let mut capped = put(b, &logits, b.activation_dtype())?;
        b.softcap(&mut capped, 30.0)
            .map_err(|e| format!("softcap: {e}"))?;
        let capped = b.download(&capped).map_err(|e| e.to_string())?;
        for (cap, reference) in [(None, &logits), (Some(30.0), &capped)] {
            for n in [rows, 2] {
                let got = b
                    .argmax_rows(&lb, vocab, n, cap)
                    .map_err(|e| format!("argmax_rows: {e}"))?;
                let want: Vec<u32> = reference[..n * vocab]
                    .chunks_exact(vocab)
                    .map(crate::sampling::argmax)
                    .collect();
                if got != want {
                    return Err(format!(
                        "argmax_rows vocab {vocab} cap {cap:?}: got {got:?}, want {want:?}"
                    ));
                }
            }
        }
        let after = b.download(&lb).map_err(|e| e.to_string())?;
        if after
            .iter()
            .zip(&logits)
            .any(|(a, l)| a.to_bits() != l.to_bits())
        {
            return Err(format!("argmax_rows vocab {vocab}: changed its logits"));
        }
    }
    Ok(())
}

/// Greedy tokens kept where the logits are: `argmax_start` then `argmax_finish` gives the
/// host `argmax`, and `feed_tokens` puts a started step's ids into the marked entries of
/// an index (read back through `embedding_idx`) while a later step is queued behind it,
/// unmarked ids untouched and a mark past the rows taken as id 0.
pub fn check_feed_tokens<B: Backend>(b: &B) -> CheckResult {
    use crate::sampling::FED_TOKEN;
    let mut data = TestData::new(802);
    let (vocab, rows, hidden) = (1000, 6, 8);
    let step = |data: &mut TestData| -> Vec<f32> {
        (0..rows * vocab).map(|_| data.normal() * 3.0).collect()
    };
    let (first, second) = (step(&mut data), step(&mut data));
    let want =
        |l: &[f32]| -> Vec<u32> { l.chunks_exact(vocab).map(crate::sampling::argmax).collect() };
    let (want_first, want_second) = (want(&first), want(&second));
    let table: Vec<f32> = (0..vocab * hidden).map(|_| data.normal()).collect();
    let tb = put(b, &table, b.activation_dtype())?;
    let stored_table = b.download(&tb).map_err(|e| e.to_string())?;
    let l1 = put(b, &first, b.activation_dtype())?;
    let l2 = put(b, &second, b.activation_dtype())?;
    let t1 = ctx("argmax_start", b.argmax_start(&l1, vocab, rows, None))?;
    let marked = [
        7,
        FED_TOKEN | 2,
        999,
        FED_TOKEN,
        FED_TOKEN | 5,
        FED_TOKEN | 40,
    ];
    let mut ids = ctx("upload_index", b.upload_index(&[0; 6]))?;
    ctx("write_index", b.write_index(&mut ids, &marked))?;
    ctx("feed_tokens", b.feed_tokens(&mut ids, &t1))?;
    // The next step is queued before the first one's ids are read.
    let t2 = ctx("argmax_start", b.argmax_start(&l2, vocab, rows, None))?;
    let mut out = put(b, &vec![0.0; marked.len() * hidden], b.activation_dtype())?;
    ctx(
        "embedding_idx",
        b.embedding_idx(&ids, &tb, hidden, 1.0, &mut out),
    )?;
    let got_first = ctx("argmax_finish", b.argmax_finish(t1))?;
    let got_second = ctx("argmax_finish", b.argmax_finish(t2))?;
    if got_first != want_first || got_second != want_second {
        return Err(format!(
            "argmax_start/finish: got {got_first:?} and {got_second:?}, want {want_first:?} and {want_second:?}"
        ));
    }
    let mut fed = marked.to_vec();
    crate::sampling::feed_tokens(&mut fed, &want_first);
    if fed != [7, want_first[2], 999, want_first[0], want_first[5], 0] {
        return Err(format!("sampling::feed_tokens: {fed:?}"));
    }
    let got = b.download(&out).map_err(|e| e.to_string())?;
    for (i, &id) in fed.iter().enumerate() {
        let row = &stored_table[id as usize * hidden..(id as usize + 1) * hidden];
        if got[i * hidden..(i + 1) * hidden] != *row {
            return Err(format!("feed_tokens: entry {i} is not the row of id {id}"));
        }
    }
    Ok(())
}
