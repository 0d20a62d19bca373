//! The backend's logit adjustments against the host definition
//! ([`crate::sampling::adjust_rows`]).

use super::{ctx, put, CheckResult, TestData};
use crate::sampling::{
    adjust_rows, mask_rows, pick_rows, RowAdjust, RowDraw, RowMask, SamplingParams, FED_TOKEN,
};
use crate::{Backend, DType};

/// `adjust_logits` against the host `adjust_rows`, to the bit: rows adjusted out of order
/// and one left alone, every list empty or long (more entries than a block has threads),
/// positive and negative logits under a repetition penalty above and below 1, negative
/// penalties, counts of 0 (prompt-only tokens), biases of ±100, masks, pending tokens (ids
/// seen or not, repeated, and marks read from an earlier step's picks still on the
/// backend, one past its rows); then a greedy pick of the adjusted rows, queued behind the
/// adjustment, against the host's.
pub fn check_adjust_logits<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(802);
    for vocab in [7usize, 1000, 262_144] {
        let rows = 4;
        let logits: Vec<f32> = (0..rows * vocab).map(|_| data.normal() * 4.0).collect();
        let mut distinct = |n: usize| {
            let mut ids: Vec<u32> = (0..n.min(vocab))
                .map(|_| data.below(vocab) as u32)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let long = 600;
        let bias: Vec<(u32, f32)> = distinct(long)
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, [100.0, -100.0, 0.5, -3.25][i % 4]))
            .collect();
        let seen: Vec<(u32, u32)> = distinct(long)
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, (i % 5) as u32))
            .collect();
        // The feeding step: two rows whose greedy picks are a seen id and an unseen one.
        let unseen = (0..vocab as u32)
            .find(|t| seen.iter().all(|s| s.0 != *t))
            .unwrap_or(0);
        let fed_ids = [seen[seen.len() / 2].0, unseen];
        let mut feeding = vec![0.0f32; 2 * vocab];
        for (r, &t) in fed_ids.iter().enumerate() {
            feeding[r * vocab + t as usize] = 10.0;
        }
        let feeding = put(b, &feeding, DType::F32)?;
        let greedy2: Vec<RowDraw> = Vec::new();
        let fed = ctx(
            "pick_start",
            b.pick_start(&feeding, vocab, 2, None, &greedy2),
        )?;
        let pending = vec![
            FED_TOKEN,
            FED_TOKEN | 1,
            FED_TOKEN | 1,
            FED_TOKEN | 9,
            seen[0].0,
            unseen,
            (vocab - 1) as u32,
        ];
        let adjusts = [
            RowAdjust {
                row: 3,
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                repetition_penalty: 1.3,
                bias: bias.clone(),
                seen: seen.clone(),
                masked: distinct(3),
                pending: pending.clone(),
            },
            RowAdjust {
                row: 0,
                presence_penalty: -2.0,
                frequency_penalty: -0.7,
                repetition_penalty: 0.6,
                bias: Vec::new(),
                seen,
                masked: Vec::new(),
                pending: vec![FED_TOKEN | 1, FED_TOKEN],
            },
            RowAdjust {
                row: 1,
                repetition_penalty: 1.0,
                bias,
                masked: distinct(2),
                // No penalty: pending tokens change nothing.
                pending,
                ..RowAdjust::default()
            },
        ];
        let mut buf = put(b, &logits, DType::F32)?;
        let mut want = b.download(&buf).map_err(|e| e.to_string())?;
        adjust_rows(&mut want, vocab, &adjusts, &fed_ids).map_err(|e| e.to_string())?;
        ctx(
            "adjust_logits",
            b.adjust_logits(&mut buf, vocab, &adjusts, Some(&fed)),
        )?;
        let fed_picked = ctx("pick_finish", b.pick_finish(fed))?;
        if fed_picked.iter().map(|p| p.id).ne(fed_ids) {
            return Err(format!(
                "the feeding step picked {fed_picked:?}, want {fed_ids:?}"
            ));
        }
        let greedy: Vec<RowDraw> = (0..rows)
            .map(|row| RowDraw {
                row,
                params: SamplingParams::greedy(),
                uniform: 0,
                logprobs: Some(2),
            })
            .collect();
        let picked = ctx("pick_start", b.pick_start(&buf, vocab, rows, None, &greedy))?;
        let picked = ctx("pick_finish", b.pick_finish(picked))?;
        let got = b.download(&buf).map_err(|e| e.to_string())?;
        if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!(
                "adjust_logits vocab {vocab}: row {} id {}: got {}, want {}",
                i / vocab,
                i % vocab,
                got[i],
                want[i]
            ));
        }
        let want_picks = pick_rows(&want, vocab, rows, &greedy).map_err(|e| e.to_string())?;
        if !super::sampling::same_picks(&picked, &want_picks) {
            return Err(format!(
                "a pick after adjust_logits, vocab {vocab}: got {picked:?}, want {want_picks:?}"
            ));
        }
    }
    // Refused: an id past the vocabulary, an id biased twice, a row past the logits.
    let mut buf = put(b, &[0.0; 8], DType::F32)?;
    let bad = [
        RowAdjust {
            masked: vec![4],
            ..RowAdjust::default()
        },
        RowAdjust {
            bias: vec![(1, 1.0), (1, 2.0)],
            ..RowAdjust::default()
        },
        RowAdjust {
            row: 2,
            ..RowAdjust::default()
        },
        RowAdjust {
            repetition_penalty: 2.0,
            pending: vec![5],
            ..RowAdjust::default()
        },
    ];
    for a in bad {
        if b.adjust_logits(&mut buf, 4, std::slice::from_ref(&a), None)
            .is_ok()
        {
            return Err(format!("adjust_logits accepted {a:?}"));
        }
    }
    Ok(())
}

/// `mask_logits` against the host `mask_rows`, to the bit: rows masked out of order and one
/// left alone, masks shorter than the vocabulary (ids past them disallowed), one allowing a
/// single id; then a draw from the masked rows, queued behind the mask, against the host's.
pub fn check_mask_logits<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(803);
    for vocab in [7usize, 1000, 262_144] {
        let rows = 4;
        let logits: Vec<f32> = (0..rows * vocab).map(|_| data.normal() * 4.0).collect();
        let words = vocab.div_ceil(32);
        let mut random_bits = |n: usize| {
            (0..n)
                .map(|_| data.below(1 << 16) as u32 * 65_537)
                .collect()
        };
        let single = vocab / 2;
        let mut one = vec![0u32; words];
        one[single / 32] = 1 << (single % 32);
        let masks = [
            RowMask {
                row: 2,
                allowed: random_bits(words),
            },
            RowMask {
                row: 0,
                // Shorter than the vocabulary: the ids past it are disallowed.
                allowed: random_bits(words.div_ceil(2)),
            },
            RowMask {
                row: 3,
                allowed: one,
            },
        ];
        let mut buf = put(b, &logits, DType::F32)?;
        let mut want = b.download(&buf).map_err(|e| e.to_string())?;
        mask_rows(&mut want, vocab, &masks).map_err(|e| e.to_string())?;
        ctx("mask_logits", b.mask_logits(&mut buf, vocab, &masks))?;
        let draws: Vec<RowDraw> = (0..rows)
            .map(|row| RowDraw {
                row,
                params: SamplingParams {
                    temperature: 0.8,
                    ..SamplingParams::greedy()
                },
                uniform: 0x1234_5678_9abc_def0 ^ row as u64,
                logprobs: None,
            })
            .collect();
        let picked = ctx("pick_start", b.pick_start(&buf, vocab, rows, None, &draws))?;
        let picked = ctx("pick_finish", b.pick_finish(picked))?;
        let got = b.download(&buf).map_err(|e| e.to_string())?;
        if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!(
                "mask_logits vocab {vocab}: row {} id {}: got {}, want {}",
                i / vocab,
                i % vocab,
                got[i],
                want[i]
            ));
        }
        let want_picks = pick_rows(&want, vocab, rows, &draws).map_err(|e| e.to_string())?;
        if !super::sampling::same_picks(&picked, &want_picks) || picked[3].id as usize != single {
            return Err(format!(
                "a draw after mask_logits, vocab {vocab}: got {picked:?}, want {want_picks:?}"
            ));
        }
    }
    // Refused: a row past the logits, a row twice.
    let mut buf = put(b, &[0.0; 8], DType::F32)?;
    let past = [RowMask {
        row: 2,
        allowed: vec![1],
    }];
    let twice = [RowMask::default(), RowMask::default()];
    for bad in [&past[..], &twice[..]] {
        if b.mask_logits(&mut buf, 4, bad).is_ok() {
            return Err(format!("mask_logits accepted {bad:?}"));
        }
    }
    Ok(())
}
