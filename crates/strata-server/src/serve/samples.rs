//! `n` and `best_of`: several samples of one prompt.
//!
//! Each sample is a request of its own in the engine. The first is submitted as usual, the
//! others as its siblings ([`Engine::submit_sibling`]): they start once its prompt is in
//! the prefix cache and reuse its whole pages, so the prompt is computed once. With a
//! `seed`, sample `i` draws with `seed + i` (wrapping), so every sample differs and the
//! whole answer reproduces; without one, each sample gets a seed of its own.

use strata_engine::{Engine, GenerationRequest, RequestGuard, Update};
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;

/// The most samples (`n`, and `best_of`) one prompt may ask for.
pub const MAX_SAMPLES: u32 = 16;

/// How many samples each prompt runs, and how many come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Samples {
    /// Choices returned per prompt.
    pub n: usize,
    /// Samples generated per prompt (`>= n`); the `n` with the highest cumulative
    /// logprob come back when it is larger.
    pub best_of: usize,
}

impl Samples {
    /// Checks `n` and `best_of` (completions only) for a request of `prompts` prompts,
    /// at most `max_requests` engine requests in all.
    pub fn parse(
        n: Option<u32>,
        best_of: Option<u32>,
        stream: bool,
        prompts: usize,
        max_requests: usize,
    ) -> Result<Self, ApiError> {
        let n = n.unwrap_or(1);
        if !(1..=MAX_SAMPLES).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("n must be between 1 and {MAX_SAMPLES}"),
            ));
        }
        let best_of = best_of.unwrap_or(n);
        if best_of < n || best_of > MAX_SAMPLES {
            return Err(ApiError::invalid(
                "best_of",
                format!("best_of must be between n ({n}) and {MAX_SAMPLES}"),
            ));
        }
        if best_of > n && stream {
            return Err(ApiError::invalid(
                "best_of",
                "best_of larger than n cannot be streamed (the choices are known only at the end)",
            ));
        }
        if prompts.saturating_mul(best_of as usize) > max_requests {
            return Err(ApiError::invalid(
                if best_of > n { "best_of" } else { "n" },
                format!(
                    "{prompts} prompt(s) x {best_of} samples; at most {max_requests} in one request"
                ),
            ));
        }
        Ok(Self {
            n: n as usize,
            best_of: best_of as usize,
        })
    }

    /// Whether the choices are picked among more samples than are returned.
    pub fn ranks(&self) -> bool {
        self.best_of > self.n
    }

    /// The engine requests of one prompt: `best_of` copies of `gen`, sample `i` drawing
    /// with `seed + i` when a seed is given. Ranking needs each token's logprob, so it is
    /// asked for (the response leaves it out unless the client asked).
    pub fn expand(&self, gen: GenerationRequest) -> Vec<GenerationRequest> {
        (0..self.best_of)
            .map(|i| {
                let mut g = gen.clone();
                g.sampling.seed = gen.sampling.seed.map(|s| s.wrapping_add(i as u64));
                if self.ranks() && g.logprobs.is_none() {
                    g.logprobs = Some(0);
                }
                g
            })
            .collect()
    }
}

/// A submitted sample: the guard that cancels it when dropped, and its updates.
pub type Submitted = (RequestGuard, UnboundedReceiver<Update>);

/// Submits the samples of one prompt, the first as the leader of the others. A refusal
/// drops the guards taken so far, which cancels those samples.
pub fn submit_samples(
    engine: &Engine,
    gens: Vec<GenerationRequest>,
) -> Result<Vec<Submitted>, ApiError> {
    let mut out: Vec<Submitted> = Vec::with_capacity(gens.len());
    for gen in gens {
        let sub = match out.first() {
            None => engine.submit(gen)?,
            Some((leader, _)) => engine.submit_sibling(gen, leader)?,
        };
        out.push(sub);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<Samples, ApiError>) -> String {
        format!("{:?}", r.unwrap_err())
    }

    #[test]
    fn bounds_name_the_field() {
        assert_eq!(
            Samples::parse(None, None, false, 1, 256).unwrap(),
            Samples { n: 1, best_of: 1 }
        );
        assert_eq!(
            Samples::parse(Some(2), Some(5), false, 1, 256).unwrap(),
            Samples { n: 2, best_of: 5 }
        );
        assert!(code(Samples::parse(Some(0), None, false, 1, 256)).contains("\"n\""));
        assert!(code(Samples::parse(Some(17), None, false, 1, 256)).contains("\"n\""));
        assert!(code(Samples::parse(Some(3), Some(2), false, 1, 256)).contains("best_of"));
        assert!(code(Samples::parse(Some(1), Some(17), false, 1, 256)).contains("best_of"));
        assert!(code(Samples::parse(None, Some(3), true, 1, 256)).contains("best_of"));
        // best_of equal to n is plain sampling, and streams.
        assert!(Samples::parse(Some(2), Some(2), true, 1, 256).is_ok());
        assert!(code(Samples::parse(Some(16), None, false, 17, 256)).contains("\"n\""));
    }

    #[test]
    fn seeds_follow_the_documented_rule() {
        let mut gen = GenerationRequest::new(vec![1, 2], 4);
        gen.sampling.seed = Some(u64::MAX);
        let s = Samples { n: 1, best_of: 3 };
        let seeds: Vec<_> = s.expand(gen).iter().map(|g| g.sampling.seed).collect();
        assert_eq!(seeds, [Some(u64::MAX), Some(0), Some(1)]);
        let plain = Samples { n: 2, best_of: 2 }.expand(GenerationRequest::new(vec![1], 4));
        assert!(plain
            .iter()
            .all(|g| g.sampling.seed.is_none() && g.logprobs.is_none()));
        let ranked = s.expand(GenerationRequest::new(vec![1], 4));
        assert!(ranked.iter().all(|g| g.logprobs == Some(0)));
    }
}
