//! Samples of one prompt (`n` > 1) submitted as siblings share the prompt's KV pages.

mod common;

use std::collections::HashMap;

use common::{fake_config, pool, record, reference_tokens, FakeModel, VOCAB};
use strata_kv::{CacheType, PoolKind};
use strata_sched::{Request, Scheduler, SchedulerConfig};
use strata_types::sampling::SamplingParams;

const PAGE: usize = 4;
const PROMPT: usize = 41;
const SAMPLES: u64 = 4;

fn prompt() -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|i| 1 + (i * 5 + i * i) % (VOCAB as u32 - 1))
        .collect()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
    }
}

fn scheduler(cache: CacheType) -> Scheduler<FakeModel> {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 128, 128, PAGE, cache);
    let config = SchedulerConfig {
        max_running_requests: 8,
        max_batch_tokens: 256,
        // Prompts take several steps, as long prompts do in a server.
        prefill_chunk: 8,
        seed: 7,
        ..SchedulerConfig::default()
    };
    Scheduler::new(FakeModel::new(cfg), kv, config).unwrap()
}

/// Submits `SAMPLES` samples (seeds 100 + i), runs them, and returns the most full pages
/// in use after any step, the tokens computed, and each sample's outcome.
fn run(cache: CacheType, siblings: bool) -> (usize, usize, Vec<common::Outcome>) {
    let mut sched = scheduler(cache);
    let max_tokens = 6;
    let leader = sched.submit(sample_request(0, max_tokens));
    let mut ids = vec![leader];
    for i in 1..SAMPLES {
        let req = sample_request(i, max_tokens);
        ids.push(if siblings {
            sched.submit_sibling(req, leader)
        } else {
            sched.submit(req)
        });
    }
    let mut out = HashMap::new();
    let mut peak = 0;
    while sched.has_work() {
        record(&mut out, sched.step());
        sched.pool().audit().unwrap();
        let status = sched.status().kv;
        if let Some(full) = status.pools.iter().find(|p| p.pool == PoolKind::Full) {
            peak = peak.max(full.pages_used);
        }
    }
    let outcomes = ids.iter().map(|id| out[id].clone()).collect();
    (peak, sched.model().tokens_computed, outcomes)
}

fn sample_request(i: u64, max_tokens: usize) -> Request {
    let mut req = Request::new(prompt(), max_tokens);
    req.sampling = sampled(100 + i);
    req
}

#[test]
fn siblings_reuse_the_prompt_pages_and_sample_as_if_alone() {
    let (shared_pages, shared_computed, shared) = run(CacheType::Radix, true);
    let (apart_pages, apart_computed, apart) = run(CacheType::Radix, false);
    println!(
        "peak full pages: siblings {shared_pages}, apart {apart_pages}; tokens computed: \
         siblings {shared_computed}, apart {apart_computed}"
    );
    // Each sample equals the reference generation of its own seed.
    for (i, o) in shared.iter().enumerate() {
        let want = reference_tokens(&prompt(), 6, &sampled(100 + i as u64), 0, false);
        assert_eq!(o.tokens, want, "sample {i}");
        assert_eq!(o.tokens, apart[i].tokens, "sample {i}");
    }
    // The samples differ from each other (different seeds).
    assert!(shared.iter().any(|o| o.tokens != shared[0].tokens));
    // The leader computed the prompt; every sibling reused its whole pages (all but the
    // last token, rounded down to a page) and computed only the rest.
    let whole = (PROMPT - 1) / PAGE * PAGE;
    assert_eq!(shared[0].cached_tokens, 0);
    for o in &shared[1..] {
        assert_eq!(o.cached_tokens, whole);
    }
    let prompt_pages = PROMPT.div_ceil(PAGE);
    // At the peak: one copy of the prompt's whole pages plus, per sample, its own last
    // partial page and growth, far below four copies.
    assert!(
        shared_pages <= whole / PAGE + SAMPLES as usize * 2,
        "{shared_pages} pages used"
    );
    assert!(shared_pages < SAMPLES as usize * prompt_pages / 2);
    // Submitted together without the link, all four compute the whole prompt side by side
    // and hold a copy each until their prefills end (the cache merges them only then).
    assert!(
        apart_pages >= SAMPLES as usize * (prompt_pages - 2),
        "{apart_pages} pages used"
    );
    assert!(shared_computed < apart_computed / 2);
}

#[test]
fn without_the_radix_cache_siblings_still_run() {
    let (_, _, outs) = run(CacheType::Naive, true);
    for (i, o) in outs.iter().enumerate() {
        let want = reference_tokens(&prompt(), 6, &sampled(100 + i as u64), 0, false);
        assert_eq!(o.tokens, want, "sample {i}");
        assert_eq!(o.cached_tokens, 0);
    }
}

#[test]
fn cancelling_the_leader_does_not_strand_its_siblings() {
    let mut sched = scheduler(CacheType::Radix);
    let leader = sched.submit(sample_request(0, 6));
    let sib = sched.submit_sibling(sample_request(1, 6), leader);
    assert!(sched.cancel(leader));
    let mut out = HashMap::new();
    common::drain(&mut sched, &mut out);
    let want = reference_tokens(&prompt(), 6, &sampled(101), 0, false);
    assert_eq!(out[&sib].tokens, want);
    sched.pool_mut().flush_cache();
    sched.pool().audit().unwrap();
    assert_eq!(sched.pool().running_requests(), 0);
}
