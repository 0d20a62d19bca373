//! Random request sets through tiny pools: every request finishes or is cancelled, each
//! finished request produced exactly what it produces alone, and no page leaks.

mod common;

use std::collections::HashMap;

use common::{drain, fake_config, pool, record, run_alone, FakeDrafter, FakeModel, EOS, VOCAB};
use proptest::prelude::*;
use strata_kv::{CacheType, PoolKind};
use strata_sched::{FinishReason, PromptLookup, Request, Scheduler, SchedulerConfig, SeqId};
use strata_types::sampling::SamplingParams;

#[derive(Clone, Debug)]
struct Spec {
    /// Prompt: the first `shared` tokens of conversation `family`, then `suffix`.
    family: u32,
    shared: usize,
    suffix: Vec<u32>,
    max_tokens: usize,
    /// `None`: greedy; else temperature sampling with this seed.
    seed: Option<u64>,
    ignore_eos: bool,
    stop_sequence: Option<Vec<u32>>,
    logprobs: Option<usize>,
    /// Step at which the request is submitted, and at which it is cancelled.
    submit_at: usize,
    cancel_at: Option<usize>,
}

impl Spec {
    fn prompt(&self) -> Vec<u32> {
        let mut p: Vec<u32> = (0..self.shared)
            .map(|i| 1 + (self.family * 5 + (i * i) as u32 % 7) % (VOCAB as u32 - 1))
            .collect();
        p.extend(&self.suffix);
        p
    }

    fn request(&self) -> Request {
        let mut r = Request::new(self.prompt(), self.max_tokens);
        if let Some(seed) = self.seed {
            r.sampling = SamplingParams {
                temperature: 1.0,
                top_k: 8,
                top_p: 0.95,
                min_p: 0.0,
                seed: Some(seed),
            };
        }
        r.stop_ids = vec![EOS];
        r.ignore_eos = self.ignore_eos;
        r.stop_sequences = self.stop_sequence.iter().cloned().collect();
        r.logprobs = self.logprobs;
        r
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (
            0u32..3,
            0usize..28,
            prop::collection::vec(1u32..VOCAB as u32, 0..6),
        ),
        0usize..14,
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::option::weighted(0.2, prop::collection::vec(0u32..VOCAB as u32, 1..3)),
        prop::option::weighted(0.2, 0usize..4),
        0usize..8,
        prop::option::weighted(0.25, 0usize..25),
    )
        .prop_map(
            |((family, shared, suffix), max_tokens, seed, ignore_eos, stop, lp, at, cancel)| Spec {
                family,
                shared,
                suffix,
                max_tokens,
                seed,
                ignore_eos,
                stop_sequence: stop,
                logprobs: lp,
                submit_at: at,
                cancel_at: cancel.map(|c| c + at),
            },
        )
}

#[derive(Clone, Debug)]
struct Setup {
    page_size: usize,
    cache: CacheType,
    windowed: bool,
    /// Full pool pages as a fraction of the largest request's need (below 1: that request
    /// cannot fit and must end with an error).
    pool_factor: f64,
    window_ratio: f64,
    max_running: usize,
    extra_batch_tokens: usize,
    prefill_chunk: usize,
    /// Greedy decode steps queued one ahead of their reading.
    overlap: bool,
    /// Speculative rounds: tokens drafted a round (0: none), the share of wrong drafts
    /// (percent), and the most requests a round may hold.
    drafts: usize,
    miss_percent: u64,
    draft_max_requests: usize,
    /// Drafts by prompt lookup (n-grams up to this long) when the model does not draft.
    lookup: Option<usize>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::sample::select(vec![1usize, 4, 16]),
        prop::sample::select(vec![CacheType::Radix, CacheType::Naive]),
        any::<bool>(),
        prop_oneof![1 => 0.6f64..1.0, 6 => 1.0f64..3.0],
        0.3f64..1.0,
        1usize..6,
        0usize..24,
        1usize..12,
        any::<bool>(),
        (
            prop_oneof![1 => Just(0usize), 2 => 1usize..5],
            prop::sample::select(vec![0u64, 30, 100]),
            1usize..6,
            prop::option::of(1usize..4),
        ),
    )
        .prop_map(
            |(
                page_size,
                cache,
                windowed,
                pool_factor,
                window_ratio,
                max_running,
                extra,
                chunk,
                overlap,
                (drafts, miss_percent, draft_max_requests, lookup),
            )| {
                Setup {
                    page_size,
                    cache,
                    windowed,
                    pool_factor,
                    window_ratio,
                    max_running,
                    extra_batch_tokens: extra,
                    prefill_chunk: chunk,
                    overlap,
                    drafts,
                    miss_percent,
                    draft_max_requests,
                    lookup,
                }
            },
        )
}

fn check(setup: Setup, specs: Vec<Spec>) -> Result<(), TestCaseError> {
    let ps = setup.page_size;
    let pages_of = |s: &Spec| (s.prompt().len() + s.max_tokens).div_ceil(ps);
    let largest = specs.iter().map(pages_of).max().unwrap_or(1).max(1);
    let full = ((largest as f64 * setup.pool_factor) as usize).max(1);
    // Enough window pages for one request decoding alone; fewer than the full pool, so
    // the window pool is often the one that runs out.
    let window_floor = common::WINDOW.div_ceil(ps) + 2;
    let window = ((full as f64 * setup.window_ratio) as usize).max(window_floor);
    let cfg = fake_config(setup.windowed);
    let kv = pool(&cfg, full, window, ps, setup.cache);
    let config = SchedulerConfig {
        max_running_requests: setup.max_running,
        max_batch_tokens: setup.max_running + setup.extra_batch_tokens,
        prefill_chunk: setup.prefill_chunk,
        seed: 7,
        overlap: setup.overlap,
        draft_max_requests: setup.draft_max_requests,
        prompt_lookup: setup
            .lookup
            .filter(|_| setup.drafts == 0)
            .map(|n| PromptLookup::new(n, 3)),
    };
    let model = if setup.drafts > 0 {
        FakeModel::drafting(cfg, FakeDrafter::new(setup.drafts, setup.miss_percent))
    } else {
        FakeModel::new(cfg)
    };
    let mut sched = Scheduler::new(model, kv, config).unwrap();

    let mut ids: Vec<Option<SeqId>> = vec![None; specs.len()];
    let mut cancelled = vec![false; specs.len()];
    let mut outcomes = HashMap::new();
    let mut step = 0;
    while step < 10 || sched.has_work() {
        for (i, s) in specs.iter().enumerate() {
            if s.submit_at == step {
                ids[i] = Some(sched.submit(s.request()));
            }
            if s.cancel_at == Some(step) {
                cancelled[i] = sched.cancel(ids[i].unwrap());
            }
        }
        record(&mut outcomes, sched.step());
        sched.pool().audit().map_err(TestCaseError::fail)?;
        step += 1;
        prop_assert!(step < 20_000, "the scheduler does not finish");
    }
    drain(&mut sched, &mut outcomes);

    for (i, s) in specs.iter().enumerate() {
        let got = &outcomes[&ids[i].unwrap()];
        let reason = got.reason.clone().expect("every request finishes");
        prop_assert_eq!(got.prompt_tokens, s.prompt().len());
        prop_assert_eq!(got.completion_tokens, got.tokens.len());
        if cancelled[i] {
            prop_assert_eq!(&reason, &FinishReason::Cancelled);
        }
        if pages_of(s) > full {
            if !cancelled[i] {
                prop_assert!(matches!(reason, FinishReason::Error(_)), "{:?}", reason);
            }
            prop_assert!(got.tokens.is_empty());
            continue;
        }
        let alone = run_alone(setup.windowed, ps, s.request());
        if cancelled[i] {
            prop_assert!(alone.tokens.starts_with(&got.tokens));
        } else {
            prop_assert_eq!(&got.tokens, &alone.tokens, "request {} {:?}", i, s);
            prop_assert_eq!(&reason, alone.reason.as_ref().unwrap());
            prop_assert_eq!(&got.logprobs, &alone.logprobs);
        }
        if s.logprobs.is_some() {
            prop_assert!(got.logprobs.iter().all(|l| l.is_some()));
        }
    }

    // Nothing is held but the prefix cache, and flushing it gives every page back.
    let status = sched.status();
    prop_assert_eq!(status.running + status.waiting, 0);
    prop_assert_eq!(status.kv.running_requests, 0);
    for p in &status.kv.pools {
        prop_assert_eq!(p.pages_used, p.pages_cached, "{:?}", p.pool);
    }
    sched.pool_mut().flush_cache();
    let pool = sched.pool();
    pool.audit().map_err(TestCaseError::fail)?;
    prop_assert_eq!(pool.free_pages(PoolKind::Full), full);
    if setup.windowed {
        prop_assert_eq!(pool.free_pages(PoolKind::Window), window);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn batched_requests_match_their_solo_runs(
        setup in setup(),
        specs in prop::collection::vec(spec(), 1..8),
    ) {
        check(setup, specs)?;
    }

    /// With a drafter or prompt lookup, requests greedy or sampled (seeded), with or without
    /// logprobs: most decode steps are speculative rounds.
    #[test]
    fn drafted_requests_match_their_solo_runs(
        setup in setup(),
        drafts in 0usize..5,
        lookup in 1usize..4,
        specs in prop::collection::vec(spec(), 1..6),
    ) {
        let setup = Setup { drafts, lookup: Some(lookup), ..setup };
        let longer = specs
            .into_iter()
            .map(|s| Spec { max_tokens: s.max_tokens * 3, ..s })
            .collect();
        check(setup, longer)?;
    }
}
