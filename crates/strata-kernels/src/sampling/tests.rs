use super::*;

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: None,
    }
}

/// Empirical frequencies of `n` draws.
fn histogram(logits: &[f32], p: &SamplingParams, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SamplerRng::new(seed);
    let mut h = vec![0.0; logits.len()];
    for _ in 0..n {
        h[sample(logits, p, &mut rng).unwrap() as usize] += 1.0;
    }
    h.iter().map(|c| c / n as f64).collect()
}

#[test]
fn greedy_picks_max_and_lowest_id_on_ties_and_ignores_nan() {
    let mut rng = SamplerRng::new(0);
    let g = SamplingParams::greedy();
    assert_eq!(sample(&[0.1, 3.0, -1.0, 3.0], &g, &mut rng).unwrap(), 1);
    assert_eq!(sample(&[f32::NAN, 0.5, 0.2], &g, &mut rng).unwrap(), 1);
    // top_k = 1 is greedy whatever the temperature, and draws nothing.
    let before = rng.clone();
    assert_eq!(
        sample(&[0.0, 2.0, 2.0], &params(1.5, 1, 1.0, 0.0), &mut rng).unwrap(),
        1
    );
    assert_eq!(rng, before);
}

#[test]
fn same_seed_gives_same_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = params(0.9, 20, 0.95, 0.01);
    let run = |seed| {
        let mut rng = SamplerRng::new(seed);
        (0..64)
            .map(|_| sample(&logits, &p, &mut rng).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn temperature_one_matches_softmax_frequencies() {
    let logits = [1.0f32, 0.0, -1.0, 2.0];
    let h = histogram(&logits, &params(1.0, 0, 1.0, 0.0), 200_000, 1);
    let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
    for (i, &x) in logits.iter().enumerate() {
        let p = (x as f64).exp() / z;
        assert!((h[i] - p).abs() < 0.006, "token {i}: {} vs {p}", h[i]);
    }
}

#[test]
fn low_temperature_sharpens() {
    let logits = [1.0f32, 0.5, 0.0];
    let h = histogram(&logits, &params(0.1, 0, 1.0, 0.0), 20_000, 2);
    assert!(h[0] > 0.99);
}

#[test]
fn top_k_only_returns_the_k_best() {
    let logits = [0.0f32, 1.0, 5.0, 4.9, 4.8, -3.0];
    let h = histogram(&logits, &params(5.0, 2, 1.0, 0.0), 20_000, 3);
    assert_eq!(h[0] + h[1] + h[4] + h[5], 0.0);
    assert!(h[2] > 0.4 && h[3] > 0.4);
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_mass() {
    // probs: 0.5, 0.3, 0.15, 0.05
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    // 0.79 needs exactly the first two (0.5 < 0.79 <= 0.5 + 0.3). (Exactly 0.8 would sit
    // on a rounding boundary of the cumulative sum.)
    let h = histogram(&logits, &params(1.0, 0, 0.79, 0.0), 50_000, 4);
    assert_eq!(h[2] + h[3], 0.0);
    assert!((h[0] - 0.625).abs() < 0.01, "{}", h[0]);
    // 0.81 needs the third as well.
    let h = histogram(&logits, &params(1.0, 0, 0.81, 0.0), 50_000, 4);
    assert!(h[2] > 0.1 && h[3] == 0.0);
    // A tiny top_p still keeps the best token.
    let h = histogram(&logits, &params(1.0, 0, 1e-6, 0.0), 1000, 4);
    assert_eq!(h[0], 1.0);
}

#[test]
fn min_p_drops_tokens_below_fraction_of_max() {
    // probs proportional to 1, 0.5, 0.2, 0.09
    let logits: Vec<f32> = [1.0f32, 0.5, 0.2, 0.09].iter().map(|p| p.ln()).collect();
    let h = histogram(&logits, &params(1.0, 0, 1.0, 0.1), 50_000, 5);
    assert_eq!(h[3], 0.0);
    assert!(h[2] > 0.05);
}

#[test]
fn invalid_params_and_shapes_are_errors() {
    let mut rng = SamplerRng::new(0);
    assert!(sample(&[1.0], &params(-1.0, 0, 1.0, 0.0), &mut rng).is_err());
    assert!(sample(&[1.0], &params(1.0, 0, 0.0, 0.0), &mut rng).is_err());
    assert!(sample(&[1.0], &params(1.0, 0, 1.0, 1.5), &mut rng).is_err());
    assert!(sample(&[], &params(1.0, 0, 1.0, 0.0), &mut rng).is_err());
    let mut rngs = vec![SamplerRng::new(0)];
    assert!(sample_rows(&[1.0, 2.0, 3.0], 2, &[SamplingParams::greedy()], &mut rngs).is_err());
}

#[test]
fn sample_rows_uses_each_rows_params() {
    let logits = [0.0f32, 1.0, 2.0, 9.0, 1.0, 0.0];
    let mut rngs = vec![SamplerRng::new(1), SamplerRng::new(2)];
    let p = [SamplingParams::greedy(), SamplingParams::greedy()];
    assert_eq!(sample_rows(&logits, 3, &p, &mut rngs).unwrap(), vec![2, 0]);
}

#[test]
fn logprobs_agree_with_direct_softmax() {
    let logits = [2.0f32, -1.0, 0.5, 0.5, 3.0];
    let ls = log_softmax(&logits);
    let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
    for (i, &x) in logits.iter().enumerate() {
        let want = (x as f64).exp() / z;
        assert!((ls[i] as f64 - want.ln()).abs() < 1e-6);
        assert!((logprob_of(&logits, i as u32) - ls[i]).abs() < 1e-7);
    }
    let top = top_logprobs(&logits, 3);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![4, 0, 2]);
    assert!((top[0].1 - ls[4]).abs() < 1e-7);
    assert_eq!(top_logprobs(&logits, 10).len(), 5);
}

/// The draw written out step by step over the whole sorted row: what `sample` computes
/// without sorting the vocabulary.
fn plain_sample(logits: &[f32], params: &SamplingParams, rng: &mut SamplerRng) -> u32 {
    if params.is_greedy() {
        return argmax(logits);
    }
    let inv_t = 1.0 / params.temperature;
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, key(x) * inv_t))
        .collect();
    let filtering = params.top_k > 0 || params.top_p < 1.0 || params.min_p > 0.0;
    let top_k = params.top_k > 0 && params.top_k < cand.len();
    if filtering {
        cand.sort_unstable_by(by_logit_desc);
    }
    if top_k {
        cand.truncate(params.top_k);
    }
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return argmax(logits);
    }
    let weight = |x: f32| ((x - max) as f64).exp();
    let mut weights: Vec<f64> = cand.iter().map(|c| weight(c.1)).collect();
    if params.top_p < 1.0 {
        // Summed in candidate order: the sorted top_k, or every id in id order.
        let total: f64 = if top_k {
            weights.iter().sum()
        } else {
            logits.iter().map(|&x| weight(key(x) * inv_t)).sum()
        };
        let target = params.top_p as f64 * total;
        let (mut cum, mut keep) = (0.0, 0);
        for w in &weights {
            if keep > 0 && cum >= target {
                break;
            }
            cum += w;
            keep += 1;
        }
        weights.truncate(keep);
        cand.truncate(keep);
    }
    if params.min_p > 0.0 {
        let keep = weights
            .iter()
            .take_while(|&&w| w >= params.min_p as f64)
            .count()
            .max(1);
        weights.truncate(keep);
        cand.truncate(keep);
    }
    let total: f64 = weights.iter().sum();
    let u = rng.next_f64() * total;
    let mut cum = 0.0;
    for (c, w) in cand.iter().zip(&weights) {
        cum += w;
        if u < cum {
            return c.0;
        }
    }
    cand[weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)].0
}

/// `sample` against the plain definition over rows of 1 to 70,000 ids (flat rows whose
/// nucleus takes several selection rounds or the whole row, peaked ones, ties, NaN and -inf
/// entries) and every filter combination: the same token from the same stream, every time.
#[test]
fn sample_equals_the_plain_definition() {
    let mut data = crate::conformance::TestData::new(77);
    let mut checked = 0;
    for vocab in [1usize, 2, 7, 100, 3000, 70_000] {
        for spread in [0.05f32, 1.0, 4.0, 40.0] {
            let mut logits: Vec<f32> = (0..vocab).map(|_| data.normal() * spread).collect();
            if vocab > 10 {
                // Ties, NaN and -inf.
                logits[vocab / 2] = logits[vocab / 3];
                logits[vocab / 5] = f32::NAN;
                logits[vocab / 7] = f32::NEG_INFINITY;
                for x in logits.iter_mut().step_by(11) {
                    *x = (*x * 2.0).round() / 2.0;
                }
            }
            // The largest rows at two spreads and one temperature: the plain definition
            // sorts the whole row every time.
            let temperatures: &[f32] = match (vocab, spread) {
                (70_000, s) if s == 0.05 || s == 4.0 => &[1.0],
                (70_000, _) => &[],
                _ => &[0.3, 1.0, 1.7],
            };
            for &temperature in temperatures {
                for top_k in [0usize, 1, 5, 40, vocab, vocab + 3] {
                    for top_p in [1.0f32, 0.999, 0.9, 0.3] {
                        for min_p in [0.0f32, 0.05, 0.6] {
                            let p = params(temperature, top_k, top_p, min_p);
                            let seed = checked as u64;
                            let (mut a, mut b) = (SamplerRng::new(seed), SamplerRng::new(seed));
                            for _ in 0..2 {
                                let got = sample(&logits, &p, &mut a).unwrap();
                                let want = plain_sample(&logits, &p, &mut b);
                                assert_eq!(got, want, "vocab {vocab} spread {spread} {p:?}");
                            }
                            assert_eq!(a, b);
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 4000, "{checked}");
}
