//! Speculative rounds over the fake model and its fake drafter: output is each request's
//! plain greedy output whatever the drafts, right drafts cut the steps, wrong ones pause.

mod common;

use std::collections::HashMap;

use common::{drain, fake_config, pool, run_alone, FakeDrafter, FakeModel, Outcome, VOCAB};
use strata_kv::CacheType;
use strata_sched::{DraftStats, FinishReason, Request, Scheduler, SchedulerConfig, SeqId};

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

/// Runs `reqs` together through a scheduler whose model drafts `k` tokens a round with
/// `miss_percent` of them wrong; returns the outcomes, the model's forward passes and the
/// scheduler's draft figures.
fn run(
    windowed: bool,
    k: usize,
    miss_percent: u64,
    reqs: Vec<Request>,
) -> (Vec<Outcome>, usize, DraftStats) {
    let cfg = fake_config(windowed);
    let kv = pool(&cfg, 256, 256, 4, CacheType::Radix);
    let config = SchedulerConfig {
        max_running_requests: 4,
        max_batch_tokens: 64,
        prefill_chunk: 8,
        seed: 7,
        overlap: true,
        draft_max_requests: 4,
    };
    let model = FakeModel::drafting(cfg, FakeDrafter::new(k, miss_percent));
    let mut sched = Scheduler::new(model, kv, config).unwrap();
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut out = HashMap::new();
    drain(&mut sched, &mut out);
    let stats = sched.status().drafts;
    sched.pool_mut().flush_cache();
    sched.pool().audit().unwrap();
    assert_eq!(sched.pool().running_requests(), 0);
    let outcomes = ids.iter().map(|id| out.remove(id).unwrap()).collect();
    (outcomes, sched.model().forwards, stats)
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
/// kept tokens, requests joining while others run rounds, sampled requests beside greedy
/// ones (no rounds while they run) all give each request's own output.
#[test]
fn rounds_end_where_plain_decoding_ends() {
    let base = run_alone(true, 4, greedy(prompt(7, 4), 30)).tokens;
    let reqs = || {
        let mut stopped = greedy(prompt(7, 4), 30);
        stopped.stop_sequences = vec![base[9..11].to_vec()];
        let mut sampled = Request::new(prompt(5, 6), 12);
        sampled.sampling = strata_kernels::sampling::SamplingParams {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(3),
        };
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
