//! Greedy speculative decoding of one request: the drafter proposes a run of tokens, the
//! target checks them all in one step, and the longest prefix that equals the target's own
//! greedy choices is kept, with the target's token after it. The output is the target's
//! greedy output; the drafter only decides how many tokens each target step yields.

use std::time::Instant;

use strata_kernels::{Backend, StridedCopy};
use strata_kv::{KvPool, KvStorage, RequestId};
use strata_model::{Assistant, DraftSeq, ForwardBatch, KvCache, LogitsMode, Model, SeqChunk};

use crate::generate::{prefill_to_last, GenerateParams};
use crate::{EngineError, Result};

/// How the drafts fared over one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Target steps that checked drafts.
    pub rounds: usize,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the target agreed with.
    pub accepted: usize,
}

impl DraftStats {
    /// Tokens a target step yields on average (accepted drafts plus the target's own).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }
}

/// Proposes tokens for one sequence. The assistant does; tests stand in their own.
pub(crate) trait Drafter<B: Backend> {
    /// Up to `n` tokens to follow `token` (at `seq.position`, K/V not stored), starting from
    /// `hidden`, the target's final-normed state of the row that produced `token`.
    fn draft<K: KvCache<B>>(
        &self,
        target: &Model<B>,
        kv: &mut K,
        seq: DraftSeq,
        token: u32,
        hidden: &B::Buffer,
        n: usize,
    ) -> Result<Vec<u32>>;
}

impl<B: Backend> Drafter<B> for Assistant<B> {
    fn draft<K: KvCache<B>>(
        &self,
        target: &Model<B>,
        kv: &mut K,
        seq: DraftSeq,
        token: u32,
        hidden: &B::Buffer,
        n: usize,
    ) -> Result<Vec<u32>> {
        if n == 0 {
            return Ok(vec![]);
        }
        let round = Assistant::draft(self, target, kv, &[seq], &[token], hidden, n)?;
        Ok(round.into_iter().map(|step| step[0]).collect())
    }
}

/// What a speculative generation produced.
pub(crate) struct Speculated {
    pub tokens: Vec<u32>,
    pub stopped: bool,
    pub stats: DraftStats,
    /// When the prompt's last step had returned (the first token).
    pub prompt_done: Instant,
}

/// Generates after `prompt` on `req` (a fresh request of `kv`) with `p.draft_tokens`
/// drafts a round. The prompt runs in chunks; then each round drafts from the newest
/// token, verifies `[token, drafts..]` in one target step, keeps the agreed prefix and the
/// target's next token, and drops the K/V of the rest.
#[allow(clippy::too_many_arguments)]
pub(crate) fn generate<B: Backend, S: KvStorage, D: Drafter<B>>(
    model: &Model<B>,
    drafter: &D,
    kv: &mut KvPool<S>,
    req: RequestId,
    prompt: &[u32],
    p: &GenerateParams,
    stop_ids: &[u32],
) -> Result<Speculated>
where
    KvPool<S>: KvCache<B>,
{
    let b = model.backend();
    let h = model.config().hidden_size;
    let last = prefill_to_last(model, kv, req, prompt, p.prefill_chunk, LogitsMode::Last)?;
    let out = model.forward_greedy_rows(kv, &last)?;
    let (mut next, mut hidden) = match (out.tokens.first().and_then(|t| t.first()), out.hidden) {
        (Some(&t), Some(hid)) => (t, hid),
        _ => return Err(EngineError::Invalid("the model returned no token".into())),
    };
    let prompt_done = Instant::now();
    let done = |tokens, stopped, stats| Speculated {
        tokens,
        stopped,
        stats,
        prompt_done,
    };

    let mut tokens = Vec::with_capacity(p.max_tokens);
    let mut stats = DraftStats::default();
    if p.max_tokens == 0 {
        return Ok(done(tokens, false, stats));
    }
    loop {
        // `next` is the target's; it ends the generation or starts a round.
        tokens.push(next);
        if p.stop_at_eos && stop_ids.contains(&next) {
            return Ok(done(tokens, true, stats));
        }
        if tokens.len() >= p.max_tokens {
            return Ok(done(tokens, false, stats));
        }
        let pos = prompt.len() + tokens.len() - 1;
        // The drafter reads the keys a query at `pos - 1` sees; commit no further.
        kv.commit(req, pos - 1)?;
        let n = p.draft_tokens.min(p.max_tokens - tokens.len());
        let seq = DraftSeq {
            request: req,
            position: pos,
        };
        let drafts = drafter.draft(model, kv, seq, next, &hidden, n)?;
        kv.extend(req, 1 + drafts.len())?;
        let mut run = Vec::with_capacity(1 + drafts.len());
        run.push(next);
        run.extend_from_slice(&drafts);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                request: req,
                tokens: run,
                start: pos,
                logits: LogitsMode::All,
            }],
        };
        let checked = model.forward_greedy_rows(kv, &batch)?;
        let greedy = &checked.tokens[0];
        let rows = checked
            .hidden
            .ok_or_else(|| EngineError::Invalid("the model returned no hidden rows".into()))?;
        let agreed = drafts
            .iter()
            .zip(greedy)
            .take_while(|(d, g)| d == g)
            .count();
        stats.rounds += 1;
        stats.drafted += drafts.len();
        stats.accepted += agreed;
        // Positions `pos..=pos + agreed` hold verified K/V; the rest were rejected.
        kv.truncate(req, pos + agreed + 1)?;
        for &t in &drafts[..agreed] {
            tokens.push(t);
            if p.stop_at_eos && stop_ids.contains(&t) {
                return Ok(done(tokens, true, stats));
            }
            if tokens.len() >= p.max_tokens {
                return Ok(done(tokens, false, stats));
            }
        }
        next = greedy[agreed];
        let mut row = b.scratch(h, b.activation_dtype())?;
        b.copy_strided(
            &rows,
            &mut row,
            StridedCopy {
                rows: 1,
                cols: h,
                src_offset: agreed * h,
                src_stride: h,
                dst_offset: 0,
                dst_stride: h,
            },
        )?;
        hidden = row;
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use strata_kernels::cpu::CpuBackend;
    use strata_kv::{CacheType, HostStorage, KvLayout, PagePlan};

    use super::*;
    use crate::{Device, LoadedModel, Runtime};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny")
            .join(name)
    }

    /// Drafts the known greedy continuation, wrong at the chosen indices of it.
    struct Oracle {
        prompt_len: usize,
        continuation: Vec<u32>,
        wrong: Vec<usize>,
        vocab: u32,
    }

    impl Drafter<CpuBackend> for Oracle {
        fn draft<K: KvCache<CpuBackend>>(
            &self,
            _: &Model<CpuBackend>,
            _: &mut K,
            seq: DraftSeq,
            _: u32,
            _: &<CpuBackend as Backend>::Buffer,
            n: usize,
        ) -> Result<Vec<u32>> {
            let from = seq.position - self.prompt_len + 1;
            let end = (from + n).min(self.continuation.len());
            Ok((from..end)
                .map(|i| match self.wrong.contains(&i) {
                    true => (self.continuation[i] + 1) % self.vocab,
                    false => self.continuation[i],
                })
                .collect())
        }
    }

    #[test]
    fn rounds_keep_the_agreed_drafts_and_the_output_is_the_greedy_output() {
        let m = LoadedModel::load(&fixture("gemma4-tiny"), Device::Cpu).unwrap();
        let Runtime::Cpu(model) = &m.runtime else {
            unreachable!("loaded on the CPU")
        };
        let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 512).collect();
        let params = GenerateParams {
            max_tokens: 23,
            stop_at_eos: false,
            draft_tokens: 3,
            ..Default::default()
        };
        let plain = m.generate(&prompt, &params).unwrap().tokens;
        assert_eq!(plain.len(), 23);
        for wrong in [vec![], vec![1, 2, 7, 8, 9, 15], (0..23).collect()] {
            let oracle = Oracle {
                prompt_len: prompt.len(),
                continuation: plain.clone(),
                wrong: wrong.clone(),
                vocab: 512,
            };
            let layout = KvLayout::for_config(model.config(), Default::default()).unwrap();
            let plan = PagePlan {
                full: 12,
                window: 12,
                page_size: 4,
            };
            let mut kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new()).unwrap();
            let req = kv.alloc_request();
            let out = generate(model, &oracle, &mut kv, req, &prompt, &params, &[]).unwrap();
            assert_eq!(out.tokens, plain, "wrong drafts at {wrong:?}");
            let s = out.stats;
            // Every token past the first comes from a round: an agreed draft or the
            // target's own token after the agreed ones (the last round's may go unused).
            let n = plain.len();
            assert!((n - 1..=n).contains(&(s.accepted + s.rounds)), "{s:?}");
            if wrong.is_empty() {
                assert_eq!(s.accepted, s.drafted, "{s:?}");
            }
            if wrong.len() == plain.len() {
                assert_eq!(s.accepted, 0, "{s:?}");
            }
            // What stays stored is the verified positions only: every token's but perhaps
            // the last one's, which no step has read yet.
            let stored = kv.seq_len(req).unwrap() - prompt.len();
            assert!((n - 1..=n).contains(&stored), "{stored} of {n}");
            kv.release(req).unwrap();
        }
    }
}
