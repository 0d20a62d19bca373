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
    let mut h = vec![0.0; logits.len()];
    for i in 0..n {
        h[sample(logits, p, draw_uniform(seed, i as u64)).unwrap() as usize] += 1.0;
    }
    h.iter().map(|c| c / n as f64).collect()
}

#[test]
fn greedy_picks_max_and_lowest_id_on_ties_and_ignores_nan() {
    let g = SamplingParams::greedy();
    assert_eq!(sample(&[0.1, 3.0, -1.0, 3.0], &g, 0).unwrap(), 1);
    assert_eq!(sample(&[f32::NAN, 0.5, 0.2], &g, 5).unwrap(), 1);
    // top_k = 1 is greedy whatever the temperature.
    for u in [0, u64::MAX / 2, u64::MAX] {
        assert_eq!(
            sample(&[0.0, 2.0, 2.0], &params(1.5, 1, 1.0, 0.0), u).unwrap(),
            1
        );
    }
}

#[test]
fn same_seed_gives_same_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = params(0.9, 20, 0.95, 0.01);
    let run = |seed| {
        (0..64)
            .map(|i| sample(&logits, &p, draw_uniform(seed, i)).unwrap())
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
    assert!(sample(&[1.0], &params(-1.0, 0, 1.0, 0.0), 0).is_err());
    assert!(sample(&[1.0], &params(1.0, 0, 0.0, 0.0), 0).is_err());
    assert!(sample(&[1.0], &params(1.0, 0, 1.0, 1.5), 0).is_err());
    assert!(sample(&[], &params(1.0, 0, 1.0, 0.0), 0).is_err());
    assert!(pick_rows(&[1.0, 2.0, 3.0], 2, 2, &[]).is_err());
    let past = RowDraw {
        row: 1,
        params: params(1.0, 0, 1.0, 0.0),
        uniform: 0,
        logprobs: None,
    };
    assert!(pick_rows(&[1.0, 2.0, 3.0], 3, 1, &[past]).is_err());
}

#[test]
fn pick_rows_draws_only_the_rows_asked_for() {
    let logits = [0.0f32, 1.0, 2.0, 9.0, 1.0, 0.0, 0.0, 0.0, 50.0];
    let hot = params(1000.0, 0, 1.0, 0.0);
    let drawn = |uniform| RowDraw {
        row: 2,
        params: hot,
        uniform,
        logprobs: None,
    };
    let ids = |draws: &[RowDraw]| pick_ids(&pick_rows(&logits, 3, 3, draws).unwrap());
    assert_eq!(ids(&[]), vec![2, 0, 2]);
    // At a temperature of 1000 the third row is nearly flat: the uniform decides.
    assert_eq!(ids(&[drawn(0)]), vec![2, 0, 0]);
    assert_eq!(ids(&[drawn(u64::MAX)]), vec![2, 0, 2]);
    // Logprobs where asked for, of the raw row (not the temperature's), greedy rows too.
    let scored = RowDraw {
        row: 0,
        params: SamplingParams::greedy(),
        uniform: 0,
        logprobs: Some(2),
    };
    let got = pick_rows(&logits, 3, 3, &[scored, drawn(0).with_logprobs(1)]).unwrap();
    assert_eq!(got[0].logprobs, Some(token_logprobs(&logits[..3], 2, 2)));
    assert_eq!(got[1].logprobs, None);
    assert_eq!(got[2].logprobs, Some(token_logprobs(&logits[6..], 0, 1)));
}

impl RowDraw {
    fn with_logprobs(self, n: usize) -> Self {
        Self {
            logprobs: Some(n),
            ..self
        }
    }
}

#[test]
fn logprobs_match_an_f64_softmax_in_rank_order() {
    let mut rng = SamplerRng::new(17);
    for (n, spread) in [(5usize, 1.0f64), (1000, 3.0), (70_000, 8.0), (300, 0.01)] {
        let mut row: Vec<f32> = (0..n)
            .map(|_| ((rng.next_f64() - 0.5) * spread * 4.0) as f32)
            .collect();
        row[n / 2] = f32::NAN;
        row[n / 3] = f32::NEG_INFINITY;
        if n > 10 {
            row[7] = row[3];
        }
        let finite = row.iter().filter(|x| x.is_finite());
        let max = finite.clone().fold(f64::MIN, |m, &x| m.max(x as f64));
        let lse = max + finite.map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        for id in [0u32, 3, 7, (n - 1) as u32] {
            let id = id.min(n as u32 - 1);
            let want = row[id as usize] as f64 - lse;
            let got = logprob_of(&row, id) as f64;
            assert!(
                (got - want).abs() < 1e-6 * (1.0 + want.abs()),
                "{n} {id}: {got} {want}"
            );
        }
        let want_lp = |i: u32| logprob_of(&row, i);
        let top = top_logprobs(&row, 20);
        assert_eq!(top.len(), 20.min(n));
        // Value descending, ties by ascending id, NaN last with -inf.
        let mut order: Vec<u32> = (0..n as u32).collect();
        let key = |i: u32| {
            let x = row[i as usize];
            if x.is_nan() {
                f32::NEG_INFINITY
            } else {
                x
            }
        };
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, order[..20.min(n)]);
        // Longer lists take the whole-row selection.
        let long: Vec<u32> = top_values(&row, 100).iter().map(|t| t.0).collect();
        assert_eq!(long, order[..100.min(n)]);
        for &(i, lp) in &top {
            assert_eq!(lp.to_bits(), want_lp(i).to_bits());
        }
        let t = token_logprobs(&row, 3, 4);
        assert_eq!(t.logprob.to_bits(), want_lp(3).to_bits());
        assert_eq!(t.top, top_logprobs(&row, 4));
    }
    // More top logprobs than ids: every id, -inf and NaN last.
    let top = top_logprobs(&[f32::NAN, 1.0, f32::NEG_INFINITY], 10);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 0, 2]);
    assert_eq!(top[0].1, 0.0);
    assert_eq!(top[1].1, f32::NEG_INFINITY);
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

/// The draw written out step by step over the whole sorted row (every weight computed, no
/// cut at the live candidates): what `sample` computes without sorting the vocabulary.
fn plain_sample(logits: &[f32], params: &SamplingParams, uniform: u64) -> u32 {
    use super::weight::*;
    if params.is_greedy() {
        return argmax(logits);
    }
    let set = DrawSettings::new(params);
    let s: Vec<f32> = logits.iter().map(|&x| scaled(x, set.inv_t)).collect();
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return argmax(logits);
    }
    let shift = weight_shift(logits.len());
    let w = |i: usize| fixed_weight(relative(s[i], max), shift);
    let u = uniform_bits(uniform);
    let n = logits.len();
    let order: Vec<usize> = if set.filtered() {
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&i| (rank(s[i]), i));
        o
    } else {
        (0..n).collect()
    };
    let cum: Vec<u64> = order
        .iter()
        .scan(0u64, |run, &i| {
            *run += w(i);
            Some(*run)
        })
        .collect();
    let n_k = if set.top_k > 0 { set.top_k.min(n) } else { n };
    let n_p = match set.top_p32 {
        Some(p32) => {
            let target = mul_shr(cum[n_k - 1], p32, 32);
            cum.iter().position(|&c| c >= target).unwrap() + 1
        }
        None => n,
    };
    let n_m = match set.min_rel {
        Some(m) => s.iter().filter(|&&v| relative(v, max) >= m).count(),
        None => n,
    };
    let keep = n_k.min(n_p).min(n_m);
    let target = mul_shr(cum[keep - 1], u, 53);
    order[cum.iter().position(|&c| c > target).unwrap()] as u32
}

/// `sample` against the plain definition over rows of 1 to 70,000 ids (flat rows whose
/// nucleus takes several selection rounds or the whole row, peaked ones, ties, NaN and -inf
/// entries) and every filter combination: the same token from the same uniform, every time.
#[test]
fn sample_equals_the_plain_definition() {
    let mut data = Normals(SamplerRng::new(77));
    let mut checked = 0;
    for vocab in [1usize, 2, 7, 100, 3000, 70_000] {
        for spread in [0.05f32, 1.0, 4.0, 40.0] {
            let mut logits: Vec<f32> = (0..vocab).map(|_| data.normal() * spread).collect();
            if vocab > 10 {
                // Ties, NaN, -inf and -0.
                logits[vocab / 2] = logits[vocab / 3];
                logits[vocab / 5] = f32::NAN;
                logits[vocab / 7] = f32::NEG_INFINITY;
                logits[vocab / 9] = -0.0;
                logits[vocab / 8] = 0.0;
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
                            for i in 0..2 {
                                let u = draw_uniform(checked, i);
                                let got = sample(&logits, &p, u).unwrap();
                                let want = plain_sample(&logits, &p, u);
                                assert_eq!(got, want, "vocab {vocab} spread {spread} {p:?}");
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 4000, "{checked}");
}

#[test]
fn clustered_argmax_searches_the_best_clusters_only() {
    // Six tokens in three clusters of two: cluster 0 = {4, 1}, 1 = {0, 5}, 2 = {2, 3}.
    let ordering = [4, 1, 0, 5, 2, 3];
    let logits = [9.0, 1.0, 2.0, 7.0, 3.0, 8.0];
    // Clusters 2 then 0 score best: token 3 (7.0) beats 2, 4 and 1; token 0 (9.0) is not
    // searched.
    assert_eq!(super::top_clusters(&[0.5, -1.0, 2.0], 2), vec![2, 0]);
    assert_eq!(
        super::clustered_argmax(&logits, &[0.5, -1.0, 2.0], &ordering, 2),
        3
    );
    assert_eq!(
        super::clustered_argmax(&logits, &[0.5, -1.0, 2.0], &ordering, 3),
        0
    );
    // Tied scores go to the lower cluster, -0 ties with +0, NaN never wins.
    assert_eq!(super::top_clusters(&[1.0, 1.0, f32::NAN], 1), vec![0]);
    assert_eq!(super::top_clusters(&[-0.0, 0.0, f32::NAN], 2), vec![0, 1]);
    // Tied logits go to the lower id, whatever the cluster order.
    let tied = [1.0, 5.0, 5.0, 0.0, 5.0, 0.0];
    assert_eq!(
        super::clustered_argmax(&tied, &[3.0, 1.0, 2.0], &ordering, 3),
        1
    );
    // Every logit -inf: the lowest id searched.
    let none = [f32::NEG_INFINITY; 6];
    assert_eq!(
        super::clustered_argmax(&none, &[0.0, 1.0, 2.0], &ordering, 1),
        2
    );
}

/// Standard normals (Box-Muller) from a seeded stream.
struct Normals(SamplerRng);

impl Normals {
    fn normal(&mut self) -> f32 {
        let u1 = self.0.next_f64().max(1e-300);
        let u2 = self.0.next_f64();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// The one-pass definition of [`super::argmax`]: the first index whose value (NaN as -inf)
/// is greater than every earlier one's.
fn plain_argmax(logits: &[f32]) -> u32 {
    let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
        if x > best_v {
            (best, best_v) = (i, x);
        }
    }
    best as u32
}

/// The two-pass argmax against the one-pass definition: lengths around its lane and chunk
/// sizes, ties across chunks, NaN, -inf, zeros of both signs as the maximum, rows all NaN.
#[test]
fn argmax_equals_the_one_pass_definition() {
    let mut data = Normals(SamplerRng::new(5));
    let mut checked = 0;
    for n in [0usize, 1, 15, 16, 17, 255, 256, 257, 1000, 49_152] {
        let base: Vec<f32> = (0..n).map(|_| data.normal()).collect();
        let mut cases = vec![base.clone()];
        if n > 0 {
            let mut tied = base.clone();
            let top = tied.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            tied[n - 1] = top;
            tied[n / 2] = top;
            cases.push(tied);
            let mut zeros: Vec<f32> = base.iter().map(|x| -x.abs() - 1.0).collect();
            zeros[n - 1] = 0.0;
            zeros[n / 3] = -0.0;
            cases.push(zeros);
            let mut odd = base.clone();
            odd[0] = f32::NAN;
            odd[n / 4] = f32::NEG_INFINITY;
            odd[(3 * n) / 4] = f32::NAN;
            cases.push(odd);
            cases.push(vec![f32::NAN; n]);
            cases.push(vec![f32::NEG_INFINITY; n]);
        }
        for c in &cases {
            assert_eq!(super::argmax(c), plain_argmax(c), "length {n}");
            checked += 1;
        }
    }
    assert!(checked > 50);
}
