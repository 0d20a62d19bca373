//! Prompt lookup: drafts without a draft model. A request's own tokens often repeat (code
//! being edited, a document being quoted or summarised, a list being continued), so the
//! tokens that followed the latest earlier occurrence of its last few tokens are a cheap
//! guess at what comes next; the model checks the guess as it checks any draft.

/// Drafting by prompt lookup (`SchedulerConfig::prompt_lookup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest suffix matched; shorter ones are tried down to `min_ngram`.
    pub max_ngram: usize,
    /// The shortest suffix matched, in tokens (at least 1).
    pub min_ngram: usize,
    /// Tokens drafted a round at most.
    pub draft_tokens: usize,
}

impl PromptLookup {
    /// Matches suffixes of `max_ngram` tokens down to 2 (or 1 when `max_ngram` is 1).
    pub fn new(max_ngram: usize, draft_tokens: usize) -> Self {
        Self {
            max_ngram,
            min_ngram: max_ngram.min(2),
            draft_tokens,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(format!(
                "prompt lookup n-grams must satisfy 1 <= min ({}) <= max ({})",
                self.min_ngram, self.max_ngram
            ));
        }
        if self.draft_tokens == 0 {
            return Err("prompt lookup must draft at least 1 token a round".into());
        }
        Ok(())
    }

    /// `n` tokens to follow `tokens`: what followed the latest earlier occurrence of its
    /// longest matching suffix (`max_ngram` tokens down to `min_ngram`), continued as the
    /// same copy where it reaches the end (a repeating text goes on repeating). Empty when
    /// no suffix occurs earlier.
    pub fn propose(&self, tokens: &[u32], n: usize) -> Vec<u32> {
        let len = tokens.len();
        if n == 0 {
            return Vec::new();
        }
        for size in (self.min_ngram..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - size..];
            // Occurrences ending before the suffix itself, latest first.
            let found = (0..len - size)
                .rev()
                .find(|&at| &tokens[at..at + size] == suffix);
            if let Some(at) = found {
                // Copied as an overlapping copy: past the end of `tokens` the copy reads what
                // it has already proposed, so a loop of any period yields `n` tokens of it.
                let from = at + size;
                let mut out: Vec<u32> = Vec::with_capacity(n);
                for i in from..from + n {
                    let t = if i < len { tokens[i] } else { out[i - len] };
                    out.push(t);
                }
                return out;
            }
        }
        Vec::new()
    }
}

impl PromptLookup {
    /// Whether [`PromptLookup::propose`] could find a match once one more token follows
    /// `tokens`: the last `min_ngram - 1` of them occur earlier with a token after them.
    pub fn may_propose(&self, tokens: &[u32]) -> bool {
        let m = self.min_ngram - 1;
        let len = tokens.len();
        if len <= m {
            return false;
        }
        let suffix = &tokens[len - m..];
        (0..len - m).any(|at| &tokens[at..at + m] == suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_longest_match_is_continued() {
        let l = PromptLookup::new(3, 4);
        // "a b c d" then later "x b c" : the 2-gram "b c" matches; 3-gram "x b c" does not.
        let t = [1, 2, 3, 4, 5, 9, 2, 3];
        assert_eq!(l.propose(&t, 4), vec![4, 5, 9, 2]);
        // Two earlier occurrences of "2 3": the latest one wins.
        let t = [2, 3, 7, 2, 3, 8, 6, 2, 3];
        assert_eq!(l.propose(&t, 2), vec![8, 6]);
        // A longer suffix match beats a later shorter one.
        let t = [5, 2, 3, 7, 1, 2, 3, 9, 5, 2, 3];
        assert_eq!(l.propose(&t, 1), vec![7]);
        // Past the end of the tokens the copy goes on over itself: the loop continues.
        let t = [4, 6, 4, 6];
        assert_eq!(l.propose(&t, 5), vec![4, 6, 4, 6, 4]);
        let t = [9, 1, 7, 7, 7];
        assert_eq!(l.propose(&t, 3), vec![7, 7, 7]);
    }

    #[test]
    fn nothing_is_proposed_without_an_earlier_occurrence() {
        let l = PromptLookup::new(3, 4);
        assert!(l.propose(&[1, 2, 3, 4], 4).is_empty());
        assert!(l.propose(&[7], 4).is_empty());
        assert!(l.propose(&[], 4).is_empty());
        // Single tokens match only when asked for.
        assert!(l.propose(&[3, 1, 2, 3], 2).is_empty());
        assert_eq!(
            PromptLookup::new(1, 2).propose(&[3, 1, 2, 3], 2),
            vec![1, 2]
        );
        let one = PromptLookup::new(1, 3);
        assert_eq!(one.propose(&[3, 1, 2, 3], 3), vec![1, 2, 3]);
        assert!(l.propose(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn a_match_is_possible_exactly_when_some_next_token_makes_one() {
        for l in [PromptLookup::new(3, 2), PromptLookup::new(1, 2)] {
            for t in [
                vec![1, 2, 3, 2],
                vec![1, 2, 3, 4],
                vec![5, 5],
                vec![7],
                vec![],
                vec![1, 2, 1, 3, 1],
            ] {
                let some_next = (0..8).any(|x| {
                    let mut u = t.clone();
                    u.push(x);
                    !l.propose(&u, 1).is_empty()
                });
                assert_eq!(l.may_propose(&t), some_next, "{l:?} {t:?}");
            }
        }
    }

    #[test]
    fn every_proposal_continues_an_earlier_occurrence() {
        // A deterministic sweep over short sequences from a small alphabet.
        let l = PromptLookup::new(3, 3);
        let mut state = 12345u64;
        for _ in 0..2000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 1 + (state >> 59) as usize;
            let t: Vec<u32> = (0..len).map(|i| ((state >> (i % 60)) & 3) as u32).collect();
            let p = l.propose(&t, 3);
            if p.is_empty() {
                continue;
            }
            // The tokens followed by the proposal: the copy reads this sequence.
            let whole: Vec<u32> = t.iter().chain(&p).copied().collect();
            let ok = p.len() == 3
                && (2..=3).any(|size| {
                    size < len
                        && (0..len - size).any(|at| {
                            t[at..at + size] == t[len - size..]
                                && whole[at + size..].starts_with(&p)
                        })
                });
            assert!(ok, "{t:?} -> {p:?}");
        }
    }
}
