//! Speculative rounds over the fake model and its fake drafter: output is each request's
//! plain greedy output whatever the drafts, right drafts cut the steps, wrong ones pause.

mod common;

use std::collections::HashMap;

use common::{drain, fake_config, pool, run_alone, FakeDrafter, FakeModel, Outcome, VOCAB};
use strata_kv::CacheType;
use strata_sched::{
    DraftStats, FinishReason, PromptLookup, Request, Scheduler, SchedulerConfig, SeqId,
};

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (i * 5 + salt * 7 + i * i) % (VOCAB as u32 - 1))
        .collect()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut r = Request::new(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

/// A request sampled with `temperature` and `top_p`, seeded with `seed`.
fn sampled(
    prompt: Vec<u32>,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    seed: u64,
) -> Request {
    let mut r = Request::new(prompt, max_tokens);
    r.sampling = strata_types::sampling::SamplingParams {
        temperature,
        top_k: 0,
        top_p,
        min_p: 0.0,
        seed: Some(seed),
    };
    r
}

/// Runs `reqs` together through a scheduler over `model` with `draft_max_requests` and
/// `prompt_lookup` as given, checks that the pool is left clean; returns the outcomes, the
/// model's forward passes and rounds that checked the scheduler's drafts, and the draft
/// figures.
fn serve(
    model: FakeModel,
    draft_max_requests: usize,
    prompt_lookup: Option<PromptLookup>,
    reqs: Vec<Request>,
) -> (Vec<Outcome>, (usize, usize), DraftStats) {
    let kv = pool(&model.cfg, 256, 256, 4, CacheType::Radix);
    let config = SchedulerConfig {
        max_running_requests: 4,
        max_batch_tokens: 64,
        prefill_chunk: 8,
        seed: 7,
        overlap: true,
        draft_max_requests,
        prompt_lookup,
    };
    let mut sched = Scheduler::new(model, kv, config).unwrap();
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut out = HashMap::new();
    drain(&mut sched, &mut out);
    let stats = sched.status().drafts;
    sched.pool_mut().flush_cache();
    sched.pool().audit().unwrap();
    assert_eq!(sched.pool().running_requests(), 0);
    let outcomes = ids.iter().map(|id| out.remove(id).unwrap()).collect();
    let m = sched.model();
    (outcomes, (m.forwards, m.verified_rounds), stats)
}

/// `reqs` through a scheduler whose model drafts `k` tokens a round with `miss_percent` of
/// them wrong: the outcomes, the model's forward passes and the draft figures.
fn run(
    windowed: bool,
    k: usize,
    miss_percent: u64,
    reqs: Vec<Request>,
) -> (Vec<Outcome>, usize, DraftStats) {
    let model = FakeModel::drafting(fake_config(windowed), FakeDrafter::new(k, miss_percent));
    let (out, (forwards, _), stats) = serve(model, 4, None, reqs);
    (out, forwards, stats)
}

/// Each request run alone without drafts.
fn alone(reqs: Vec<Request>) -> Vec<Outcome> {
    reqs.into_iter().map(|r| run_alone(true, 4, r)).collect()
}

#[test]
fn right_drafts_are_kept_and_take_fewer_steps() {
    for windowed in [false, true] {
        let want = run_alone(windowed, 4, greedy(prompt(9, 1), 40));
        let (got, forwards, stats) = run(windowed, 3, 0, vec![greedy(prompt(9, 1), 40)]);
        assert_eq!(got[0].tokens, want.tokens, "windowed {windowed}");
        assert_eq!(got[0].reason, Some(FinishReason::Length));
        assert_eq!(stats.accepted, stats.drafted, "{stats:?}");
        // 40 tokens: the prompt's step, a round without drafts (no state yet), then
        // rounds of 4 tokens.
        assert!(stats.drafted >= 27, "{stats:?}");
        assert!(forwards <= 12, "{forwards} forward passes");
    }
}

#[test]
fn wrong_drafts_pause_drafting() {
    let reqs = || vec![greedy(prompt(6, 2), 96), greedy(prompt(11, 3), 80)];
    let want = alone(reqs());
    let (got, _, stats) = run(true, 3, 100, reqs());
    for (g, a) in got.iter().zip(&want) {
        assert_eq!(g.tokens, a.tokens);
    }
    assert_eq!(stats.accepted, 0, "{stats:?}");
    // Three rounds of 3 drafts each before the first pause, then one retry a pause
    // (16, 32, 64 tokens): far fewer drafts than tokens.
    assert!(stats.drafted > 0 && stats.drafted <= 2 * 5 * 3, "{stats:?}");
}

/// Some drafts right: stop strings and `max_tokens` that end a request inside a round's
/// kept tokens, requests joining while others run rounds, a sampled request beside greedy
/// ones all give each request's own output.
#[test]
fn rounds_end_where_plain_decoding_ends() {
    let base = run_alone(true, 4, greedy(prompt(7, 4), 30)).tokens;
    let reqs = || {
        let mut stopped = greedy(prompt(7, 4), 30);
        stopped.stop_sequences = vec![base[9..11].to_vec()];
        let sampled = sampled(prompt(5, 6), 12, 0.7, 1.0, 3);
        vec![
            stopped,
            greedy(prompt(12, 5), 17),
            greedy(prompt(3, 8), 1),
            sampled,
            greedy(prompt(20, 9), 23),
        ]
    };
    let want = alone(reqs());
    assert!(
        want[0].tokens.len() <= 11,
        "the stop string ends the first request"
    );
    for k in [1, 2, 5] {
        let (got, _, stats) = run(true, k, 30, reqs());
        for (i, (g, a)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, a.tokens, "k {k} request {i}");
            assert_eq!(g.reason, a.reason, "k {k} request {i}");
        }
        assert!(
            stats.accepted > 0 && stats.accepted < stats.drafted,
            "{stats:?}"
        );
    }
}

/// `reqs` through a scheduler drafting by prompt lookup (n-grams up to 3, `k` drafts) over
/// `model`: the outcomes, the forward passes, the rounds that checked drafts and the draft
/// figures.
fn run_lookup(
    model: FakeModel,
    k: usize,
    max_requests: usize,
    reqs: Vec<Request>,
) -> (Vec<Outcome>, usize, usize, DraftStats) {
    let lookup = Some(PromptLookup::new(3, k));
    let (out, (forwards, rounds), stats) = serve(model, max_requests, lookup, reqs);
    (out, forwards, rounds, stats)
}

/// Each request alone through a plain scheduler over `model`.
fn alone_on(model: impl Fn() -> FakeModel, reqs: Vec<Request>) -> Vec<Outcome> {
    reqs.into_iter()
        .map(|r| {
            let m = model();
            let kv = pool(&m.cfg, 256, 256, 4, CacheType::Naive);
            let mut s = Scheduler::new(m, kv, SchedulerConfig::default()).unwrap();
            let id = s.submit(r);
            let mut out = HashMap::new();
            drain(&mut s, &mut out);
            out.remove(&id).unwrap()
        })
        .collect()
}

/// A text that repeats itself: prompt lookup guesses it, every round keeps its drafts, and
/// the output is the plain output in far fewer steps.
#[test]
fn prompt_lookup_follows_a_repeating_text() {
    let model = || FakeModel::repeating(fake_config(true), 5);
    let reqs = || vec![greedy(prompt(12, 1), 60), greedy(prompt(9, 2), 45)];
    let want = alone_on(model, reqs());
    for max_requests in [1, 2] {
        let (got, forwards, rounds, stats) = run_lookup(model(), 4, max_requests, reqs());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "rounds of up to {max_requests}");
        }
        assert!(rounds > 0 && stats.accepted > 0, "{stats:?}");
        // Nearly every draft is right once the text repeats.
        assert!(stats.accepted * 10 >= stats.drafted * 9, "{stats:?}");
        assert!(forwards < 60, "{forwards} forward passes for 105 tokens");
        eprintln!(
            "rounds of up to {max_requests}: {forwards} forward passes, {rounds} rounds, {stats:?}"
        );
    }
}

/// A text that does not repeat: lookups find short matches that are mostly wrong; the
/// output is still the plain output, a sampled request's included.
#[test]
fn prompt_lookup_on_a_text_that_does_not_repeat() {
    let reqs = || {
        let sampled = sampled(prompt(5, 6), 12, 0.7, 1.0, 3);
        vec![greedy(prompt(10, 3), 50), sampled, greedy(prompt(4, 4), 33)]
    };
    let want = alone(reqs());
    let (got, _, rounds, stats) = run_lookup(FakeModel::new(fake_config(true)), 3, 4, reqs());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "request {i}");
        assert_eq!(g.reason, w.reason, "request {i}");
    }
    assert!(rounds > 0 && stats.drafted > 0, "{stats:?}");
}

#[test]
fn prompt_lookup_needs_a_model_that_checks_drafts_and_drafts_nothing_itself() {
    let cfg = fake_config(true);
    let config = SchedulerConfig {
        prompt_lookup: Some(PromptLookup::new(3, 2)),
        ..SchedulerConfig::default()
    };
    let model = FakeModel::drafting(cfg.clone(), FakeDrafter::new(2, 0));
    let kv = pool(&cfg, 64, 64, 4, CacheType::Radix);
    assert!(Scheduler::new(model, kv, config).is_err());
    let bad = SchedulerConfig {
        prompt_lookup: Some(PromptLookup::new(3, 0)),
        ..SchedulerConfig::default()
    };
    let kv = pool(&cfg, 64, 64, 4, CacheType::Radix);
    assert!(Scheduler::new(FakeModel::new(cfg), kv, bad).is_err());
}

/// Sampled requests (seeded), with logprobs or not, in rounds: each kept draft is the token
/// the request's own draw gives there, so tokens and logprobs equal plain decoding's; on a
/// repeating text the draws follow the repeat and drafts are kept.
#[test]
fn sampled_requests_keep_their_seeded_output_in_rounds() {
    let seeded = |salt: u32, logprobs: Option<usize>| {
        let mut r = sampled(prompt(11, salt), 40, 0.8, 0.95, 17 + salt as u64);
        r.ignore_eos = true;
        r.logprobs = logprobs;
        r
    };
    let reqs = || {
        vec![
            seeded(1, None),
            seeded(2, Some(2)),
            greedy(prompt(7, 3), 30),
        ]
    };
    for repeating in [true, false] {
        let model = || match repeating {
            true => FakeModel::repeating(fake_config(true), 6),
            false => FakeModel::new(fake_config(true)),
        };
        let want = alone_on(model, reqs());
        let (got, _, rounds, stats) = run_lookup(model(), 3, 4, reqs());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "repeating {repeating}, request {i}");
            assert_eq!(g.logprobs, w.logprobs, "repeating {repeating}, request {i}");
        }
        assert!(got[1].logprobs.iter().all(Option::is_some));
        assert!(rounds > 0, "repeating {repeating}: {stats:?}");
        if repeating {
            assert!(stats.accepted * 2 > stats.drafted, "{stats:?}");
        }
    }
    // The same with the model's drafter (drafts greedy, checked against the draws).
    let want = alone(reqs());
    let (got, _, stats) = run(true, 3, 30, reqs());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            (&g.tokens, &g.logprobs),
            (&w.tokens, &w.logprobs),
            "request {i}"
        );
    }
    assert!(stats.rounds > 0, "{stats:?}");
}
