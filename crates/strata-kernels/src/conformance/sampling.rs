//! The backend's sampler against the host definition in [`crate::sampling`].

use super::{ctx, put, CheckResult, TestData};
use crate::sampling::{draw_uniform, pick_rows, Picked, RowDraw, SamplingParams};
use crate::Backend;

/// `pick_start` / `pick_finish` against the host `pick_rows` over many vocabularies, row
/// kinds (ties, NaN, -inf) and sampling settings, with and without a softcap: ids and
/// log-probabilities equal to the bit.
pub fn check_sample<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(800);
    let warm = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: None,
    };
    // Every kind of row (vocabularies as in `check_argmax`): flat, spread, peaked, ties on
    // a grid, NaN and -inf among the values, all -inf, -0 next to +0, and five values
    // within 40 of the best (fewer than the top logprobs asked for, uncapped).
    for vocab in [7usize, 1000, 4099, 65_540, 262_144] {
        let rows = 9;
        let spreads = [0.05f32, 1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 8.0, 1.0];
        let mut logits: Vec<f32> = Vec::with_capacity(rows * vocab);
        for (r, &spread) in spreads.iter().enumerate() {
            let mut row: Vec<f32> = (0..vocab).map(|_| data.normal() * spread).collect();
            match r {
                3 => row.iter_mut().step_by(97).for_each(|x| *x += 15.0),
                4 => row.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
                5 => {
                    row.iter_mut().step_by(3).for_each(|x| *x = f32::NAN);
                    row.iter_mut()
                        .skip(1)
                        .step_by(5)
                        .for_each(|x| *x = f32::NEG_INFINITY);
                }
                6 => row.fill(f32::NEG_INFINITY),
                7 => {
                    row[vocab / 2] = -0.0;
                    row[vocab / 3] = 0.0;
                }
                8 => {
                    row.iter_mut().for_each(|x| *x -= 100.0);
                    row.iter_mut()
                        .step_by(vocab / 5 + 1)
                        .for_each(|x| *x += 100.0);
                }
                _ => {}
            }
            logits.extend(row);
        }
        let lb = put(b, &logits, b.activation_dtype())?;
        // The reference sees the logits as the backend stores and caps them.
        let stored = b.download(&lb).map_err(|e| e.to_string())?;
        let mut capped = put(b, &logits, b.activation_dtype())?;
        b.softcap(&mut capped, 30.0)
            .map_err(|e| format!("softcap: {e}"))?;
        let capped = b.download(&capped).map_err(|e| e.to_string())?;
        let settings = [
            warm(1.0, 0, 1.0, 0.0),
            warm(0.7, 40, 1.0, 0.0),
            warm(0.8, 0, 0.9, 0.0),
            warm(1.2, 0, 1.0, 0.05),
            warm(0.6, 50, 0.95, 0.02),
            warm(1.0, 0, 0.5, 0.0),
            warm(2.0, 1000, 1.0, 0.0),
            warm(1.0, vocab + 3, 1.0, 0.0),
            warm(0.9, 0, 1.0, 0.9),
            warm(1.5, 3, 0.99, 0.001),
            SamplingParams::greedy(),
        ];
        let trials = if vocab > 100_000 { 6 } else { 12 };
        for t in 0..trials {
            let draws: Vec<RowDraw> = (0..rows)
                .map(|r| RowDraw {
                    row: r,
                    params: settings[(r + 3 * t) % settings.len()],
                    uniform: match t {
                        0 => 0,
                        1 => u64::MAX,
                        _ => draw_uniform(vocab as u64, (t * rows + r) as u64),
                    },
                    // Logprobs with every kind of draw, greedy ones too.
                    logprobs: [None, Some(0), Some(1), Some(5), Some(20)][(r + t) % 5],
                })
                .collect();
            // Drawn rows in a shuffled order, one row left to its argmax.
            let mut asked: Vec<RowDraw> = draws.iter().rev().copied().collect();
            asked.remove(t % rows);
            for (cap, reference) in [(None, &stored), (Some(30.0), &capped)] {
                let got = ctx("pick_start", b.pick_start(&lb, vocab, rows, cap, &asked))?;
                let got = ctx("pick_finish", b.pick_finish(got))?;
                let want = pick_rows(reference, vocab, rows, &asked).map_err(|e| e.to_string())?;
                if !same_picks(&got, &want) {
                    return Err(format!(
                        "pick_start vocab {vocab} trial {t} cap {cap:?}: got {got:?}, want {want:?} ({asked:?})"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Picks equal to the bit (a row of -inf values has NaN logprobs on both sides).
pub(super) fn same_picks(a: &[Picked], b: &[Picked]) -> bool {
    let bits = |p: &Picked| {
        p.logprobs.as_ref().map(|l| {
            let top: Vec<(u32, u32)> = l.top.iter().map(|&(i, x)| (i, x.to_bits())).collect();
            (l.logprob.to_bits(), top)
        })
    };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.id == y.id && bits(x) == bits(y))
}

/// Greedy choice where the logits are: equal to the host `argmax` on rows with ties (the
/// lowest id wins), NaN (never chosen), all -inf (id 0), at the real vocabulary size, and
/// over only the first rows of a larger buffer; with a softcap, the argmax of the
/// backend's own softcapped values (ties the cap makes, values a few ulps below the
/// maximum), the logits left as they were.
pub fn check_argmax<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(801);
    // 7 and 4099: not a multiple of four (the GPU's one-value loads); 1000: 16-byte loads,
    // the tail loop alone; 65,540: the unrolled loads and a tail; 262,144: the vocabulary.
    for vocab in [7usize, 1000, 4099, 65_540, 262_144] {
        let rows = 8;
        let mut logits: Vec<f32> = (0..rows * vocab).map(|_| data.normal() * 3.0).collect();
        // Row 1: a tie between two ids for the maximum; row 2: NaNs; row 3: all -inf.
        let top = 100.0;
        logits[vocab + vocab / 2] = top;
        logits[vocab + vocab / 3] = top;
        for i in (0..vocab).step_by(3) {
            logits[2 * vocab + i] = f32::NAN;
        }
        logits[3 * vocab..4 * vocab].fill(f32::NEG_INFINITY);
        // Rows 5-7 are where a capped argmax that skips values far below the raw maximum
        // could go wrong. Row 5: values that all cap to 30, the lowest of them (300) at
        // the lowest index, +inf last: capped, the 300 wins the tie.
        let row5 = &mut logits[5 * vocab..6 * vocab];
        row5[vocab / 5] = 300.0;
        row5[4 * vocab / 5] = 400.0;
        row5[vocab - 1] = f32::INFINITY;
        // Row 6: the maximum last, and values one to eight ulps below it before it, some
        // of which cap to the same value.
        let row6 = &mut logits[6 * vocab..7 * vocab];
        let near = 20.0f32;
        row6[vocab - 1] = near;
        for k in 1..=8u32.min(vocab as u32 - 1) {
            row6[(k as usize * (vocab - 1)) / 9] = f32::from_bits(near.to_bits() - k);
        }
        // Row 7: every value the same.
        logits[7 * vocab..8 * vocab].fill(5.0);
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

/// The clustered head's pick against [`crate::sampling::clustered_argmax`], to the id: the
/// assistant's shape (262,144 tokens in 2,048 clusters, 32 searched) and a small one; rows
/// with tied scores, tied logits, NaNs, and every logit -inf.
pub fn check_clustered_argmax<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(802);
    for (vocab, clusters, top_k) in [
        (512usize, 16usize, 4usize),
        (262_144, 2048, 32),
        (4096, 4096, 1),
    ] {
        let rows = 5;
        let mut logits: Vec<f32> = (0..rows * vocab).map(|_| data.normal() * 3.0).collect();
        let mut scores: Vec<f32> = (0..rows * clusters).map(|_| data.normal()).collect();
        // A permutation of the vocabulary (every id once).
        let mut ordering: Vec<u32> = (0..vocab as u32).collect();
        for i in (1..vocab).rev() {
            let j = (data.uniform(0.0, 1.0) * (i + 1) as f32) as usize;
            ordering.swap(i, j.min(i));
        }
        // Row 1: the best scores tied, and -0 beside +0; two tokens tied for the best logit.
        scores[clusters..clusters + 3].fill(5.0);
        scores[clusters + 3] = -0.0;
        scores[clusters + 4] = 0.0;
        logits[vocab..2 * vocab]
            .iter_mut()
            .for_each(|x| *x = x.round());
        // Row 2: NaN scores and logits; row 3: every logit -inf; row 4: every score -inf.
        for i in (0..clusters).step_by(2) {
            scores[2 * clusters + i] = f32::NAN;
        }
        for i in (0..vocab).step_by(3) {
            logits[2 * vocab + i] = f32::NAN;
        }
        logits[3 * vocab..4 * vocab].fill(f32::NEG_INFINITY);
        scores[4 * clusters..5 * clusters].fill(f32::NEG_INFINITY);
        let lb = put(b, &logits, b.activation_dtype())?;
        let sb = put(b, &scores, b.activation_dtype())?;
        let stored = b.download(&lb).map_err(|e| e.to_string())?;
        let stored_scores = b.download(&sb).map_err(|e| e.to_string())?;
        let ob = b.upload_index(&ordering).map_err(|e| e.to_string())?;
        let mut out = b
            .upload_index(&vec![u32::MAX; rows])
            .map_err(|e| e.to_string())?;
        let c = crate::ClusterPick {
            rows,
            vocab,
            clusters,
            top_k,
        };
        ctx(
            "clustered_argmax",
            b.clustered_argmax(&lb, &sb, &ob, c, &mut out),
        )?;
        let got = ctx("download_index", b.download_index(&out))?;
        let want: Vec<u32> = (0..rows)
            .map(|r| {
                crate::sampling::clustered_argmax(
                    &stored[r * vocab..(r + 1) * vocab],
                    &stored_scores[r * clusters..(r + 1) * clusters],
                    &ordering,
                    top_k,
                )
            })
            .collect();
        if got != want {
            return Err(format!(
                "clustered_argmax {vocab} tokens in {clusters} clusters, {top_k} searched: got {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

/// Tokens kept where the logits are: `pick_start` then `pick_finish` gives the host's
/// picks (rows 1 and 2 of the first step drawn), and `feed_tokens` puts a started step's
/// ids into the marked entries of an index (read back through `embedding_idx`) while a
/// later step is queued behind it, unmarked ids untouched and a mark past the rows taken
/// as id 0.
pub fn check_feed_tokens<B: Backend>(b: &B) -> CheckResult {
    use crate::sampling::FED_TOKEN;
    let mut data = TestData::new(802);
    let (vocab, rows, hidden) = (1000, 6, 8);
    let step = |data: &mut TestData| -> Vec<f32> {
        (0..rows * vocab).map(|_| data.normal() * 3.0).collect()
    };
    let (first, second) = (step(&mut data), step(&mut data));
    let hot = SamplingParams {
        temperature: 5.0,
        ..SamplingParams::greedy()
    };
    let drawn = [1, 2].map(|row| RowDraw {
        row,
        params: hot,
        uniform: draw_uniform(3, row as u64),
        logprobs: (row == 2).then_some(4),
    });
    let want = |l: &[f32], d: &[RowDraw]| pick_rows(l, vocab, rows, d).map_err(|e| e.to_string());
    let (want_first, want_second) = (want(&first, &drawn)?, want(&second, &[])?);
    let table: Vec<f32> = (0..vocab * hidden).map(|_| data.normal()).collect();
    let tb = put(b, &table, b.activation_dtype())?;
    let stored_table = b.download(&tb).map_err(|e| e.to_string())?;
    let l1 = put(b, &first, b.activation_dtype())?;
    let l2 = put(b, &second, b.activation_dtype())?;
    let t1 = ctx("pick_start", b.pick_start(&l1, vocab, rows, None, &drawn))?;
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
    let t2 = ctx("pick_start", b.pick_start(&l2, vocab, rows, None, &[]))?;
    let mut out = put(b, &vec![0.0; marked.len() * hidden], b.activation_dtype())?;
    ctx(
        "embedding_idx",
        b.embedding_idx(&ids, &tb, hidden, 1.0, &mut out),
    )?;
    let got_first = ctx("pick_finish", b.pick_finish(t1))?;
    let got_second = ctx("pick_finish", b.pick_finish(t2))?;
    if !same_picks(&got_first, &want_first) || !same_picks(&got_second, &want_second) {
        return Err(format!(
            "pick_start/finish: got {got_first:?} and {got_second:?}, want {want_first:?} and {want_second:?}"
        ));
    }
    let want_first = crate::sampling::pick_ids(&want_first);
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
