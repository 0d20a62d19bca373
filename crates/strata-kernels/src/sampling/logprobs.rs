//! Log-probabilities of the raw (unwarped) distribution, as OpenAI-style `logprobs` report.

/// `log(sum exp(x))` in f64 with the max subtracted; NaN logits count as -inf.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    if max == f64::NEG_INFINITY {
        return max;
    }
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (x as f64 - max).exp())
        .sum();
    max + sum.ln()
}

/// `x_i - logsumexp(x)` for every entry.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let lse = log_sum_exp(logits);
    logits.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

/// Log-probability of one token.
pub fn logprob_of(logits: &[f32], id: u32) -> f32 {
    (logits[id as usize] as f64 - log_sum_exp(logits)) as f32
}

/// The `n` most likely tokens with their log-probabilities, most likely first
/// (ties by ascending id).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let lse = log_sum_exp(logits);
    let mut all: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .map(|(i, &x)| (i as u32, x))
        .collect();
    let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let n = n.min(all.len());
    if n == 0 {
        return Vec::new();
    }
    if n < all.len() {
        all.select_nth_unstable_by(n - 1, desc);
        all.truncate(n);
    }
    all.sort_unstable_by(desc);
    all.into_iter()
        .map(|(i, x)| (i, (x as f64 - lse) as f32))
        .collect()
}
