//! Scenario tests of the scheduler over the fake model.

mod common;

use std::collections::HashMap;

use common::{
    drain, fake_config, logits_for, pool, reference_tokens, run_alone, FakeModel, Outcome, EOS,
    VOCAB,
};
use strata_kv::{CacheType, HostStorage, KvPool, PoolKind};
use strata_sched::{
    EventKind, FinishReason, Request, SchedError, Scheduler, SchedulerConfig, SeqId, StepModel,
};
use strata_types::sampling::{
    logprob_of, token_logprobs, top_logprobs, SamplingParams, TokenLogprobs, MAX_TOP_LOGPROBS,
};
use strata_types::{ForwardBatch, ForwardOutput};

fn config(max_running: usize, batch: usize, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_running_requests: max_running,
        max_batch_tokens: batch,
        prefill_chunk: chunk,
        seed: 7,
        ..SchedulerConfig::default()
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.9,
        min_p: 0.05,
        seed: Some(seed),
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (i * 7 + salt * 3 + i * i) % (VOCAB as u32 - 1))
        .collect()
}

fn run_all(
    sched: &mut Scheduler<FakeModel>,
    reqs: Vec<Request>,
) -> (Vec<SeqId>, HashMap<SeqId, Outcome>) {
    let ids = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut out = HashMap::new();
    drain(sched, &mut out);
    (ids, out)
}

fn assert_pool_clean(pool: &mut KvPool<HostStorage>) {
    pool.audit().unwrap();
    assert_eq!(pool.running_requests(), 0);
    pool.flush_cache();
    pool.audit().unwrap();
    assert_eq!(pool.free_pages(PoolKind::Full), pool.plan().full);
    assert_eq!(pool.free_pages(PoolKind::Window), pool.plan().window);
}

#[test]
fn solo_runs_equal_the_plain_generation_loop() {
    for windowed in [false, true] {
        for (i, params) in [SamplingParams::greedy(), sampled(1), sampled(99)]
            .iter()
            .enumerate()
        {
            for len in [1, 5, 17] {
                let p = prompt(len, i as u32);
                let mut r = Request::new(p.clone(), 20);
                r.sampling = *params;
                r.stop_ids = vec![EOS];
                let got = run_alone(windowed, 4, r);
                let want = reference_tokens(&p, 20, params, params.seed.unwrap_or(7), true);
                assert_eq!(got.tokens, want, "windowed {windowed} params {params:?}");
            }
        }
    }
}

#[test]
fn long_decode_gives_window_pages_back() {
    // 300 tokens through a window pool of 12 one-token pages: only committing releases
    // the pages that fell out of the 6-token window.
    let cfg = fake_config(true);
    let kv = pool(&cfg, 400, 12, 1, CacheType::Naive);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(1, 8, 4)).unwrap();
    let mut r = Request::new(prompt(20, 1), 280);
    r.ignore_eos = true;
    let (ids, out) = run_all(&mut sched, vec![r]);
    assert_eq!(out[&ids[0]].reason, Some(FinishReason::Length));
    assert_eq!(out[&ids[0]].tokens.len(), 280);
    assert_eq!(sched.status().preemptions, 0);
    assert_pool_clean(sched.pool_mut());
}

#[test]
fn shared_prefix_is_reused_through_the_radix_cache() {
    for cache in [CacheType::Radix, CacheType::Naive] {
        let cfg = fake_config(true);
        let kv = pool(&cfg, 64, 64, 4, cache);
        let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(4, 64, 64)).unwrap();
        let system = prompt(22, 5);
        let (first, _) = run_all(&mut sched, vec![Request::new(system.clone(), 3)]);
        let computed_before = sched.model().tokens_computed;
        let mut second = system.clone();
        second.extend([3, 4, 5]);
        let (ids, out) = run_all(&mut sched, vec![Request::new(second.clone(), 3)]);
        let o = &out[&ids[0]];
        let computed = sched.model().tokens_computed - computed_before;
        assert_eq!(o.tokens, run_alone(true, 4, Request::new(second, 3)).tokens);
        match cache {
            // Whole pages of the 22-token prompt: 20 tokens.
            CacheType::Radix => {
                assert_eq!(o.cached_tokens, 20);
                assert_eq!(computed, 25 + 2 - 20);
                assert!(sched.status().kv.cache_hits >= 1);
            }
            CacheType::Naive => {
                assert_eq!(o.cached_tokens, 0);
                assert_eq!(computed, 25 + 2);
            }
        }
        assert!(!first.is_empty());
        assert_pool_clean(sched.pool_mut());
    }
}

#[test]
fn next_turn_reuses_the_previous_completion() {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 64, 64, 4, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(2, 32, 5)).unwrap();
    let first = prompt(13, 8);
    let (a, out) = run_all(&mut sched, vec![Request::new(first.clone(), 9)]);
    // The cache holds the computed tokens: the prompt and all but the last sampled token.
    let mut turn = first;
    turn.extend(&out[&a[0]].tokens);
    let computed = turn.len() - 1;
    turn.extend([2, 3, 4]);
    let (b, out) = run_all(&mut sched, vec![Request::new(turn.clone(), 4)]);
    assert_eq!(out[&b[0]].cached_tokens, computed / 4 * 4);
    assert_eq!(
        out[&b[0]].tokens,
        run_alone(true, 4, Request::new(turn, 4)).tokens
    );
    assert_pool_clean(sched.pool_mut());
}

#[test]
fn fully_cached_prompt_still_computes_its_last_token() {
    let cfg = fake_config(false);
    let kv = pool(&cfg, 64, 0, 1, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(2, 32, 32)).unwrap();
    let p = prompt(9, 2);
    let (a, out_a) = run_all(&mut sched, vec![Request::new(p.clone(), 4)]);
    let (b, out_b) = run_all(&mut sched, vec![Request::new(p.clone(), 4)]);
    assert_eq!(out_a[&a[0]].tokens, out_b[&b[0]].tokens);
    assert_eq!(out_b[&b[0]].cached_tokens, 8);
    assert_pool_clean(sched.pool_mut());
}

#[test]
fn cancel_ends_waiting_and_running_requests() {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 64, 64, 4, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(1, 16, 4)).unwrap();
    let running = sched.submit(Request::new(prompt(10, 1), 50));
    let waiting = sched.submit(Request::new(prompt(10, 2), 50));
    let mut out = HashMap::new();
    for _ in 0..5 {
        common::record(&mut out, sched.step());
    }
    assert_eq!(sched.status().running, 1);
    assert_eq!(sched.status().waiting, 1);
    assert!(sched.cancel(waiting));
    assert!(sched.cancel(running));
    assert!(!sched.cancel(running), "a second cancel finds nothing");
    assert!(!sched.cancel(SeqId(1000)));
    assert_eq!(
        sched.status().kv.running_requests,
        0,
        "pages are freed at once"
    );
    drain(&mut sched, &mut out);
    assert_eq!(out[&running].reason, Some(FinishReason::Cancelled));
    assert_eq!(out[&waiting].reason, Some(FinishReason::Cancelled));
    assert!(out[&waiting].tokens.is_empty());
    assert!(!out[&running].tokens.is_empty());
    assert_pool_clean(sched.pool_mut());
}

/// A toy detokenizer: token `t` is the letter `'a' + t`.
fn text(tokens: &[u32]) -> String {
    tokens.iter().map(|&t| (b'a' + t as u8) as char).collect()
}

#[test]
fn text_stop_strings_go_through_the_stop_function() {
    let p = prompt(7, 3);
    let mut plain = Request::new(p.clone(), 30);
    plain.ignore_eos = true;
    let free = run_alone(true, 4, plain).tokens;
    assert_eq!(free.len(), 30);
    // Stop on a two-letter string that first ends at completion token 9 or later.
    let stop: String = text(&free[8..10]);
    let first_end = (2..=free.len())
        .find(|&n| text(&free[..n]).contains(&stop))
        .unwrap();
    let mut r = Request::new(p, 30);
    r.ignore_eos = true;
    let needle = stop.clone();
    r.stop_fn = Some(Box::new(move |completion: &[u32]| {
        text(completion).contains(&needle)
    }));
    let got = run_alone(true, 4, r);
    assert_eq!(got.reason, Some(FinishReason::Stop));
    assert_eq!(got.tokens, free[..first_end]);
}

#[test]
fn eos_stop_sequences_and_max_tokens() {
    let p = prompt(6, 4);
    let mut free = Request::new(p.clone(), 40);
    free.ignore_eos = true;
    let free = run_alone(false, 4, free).tokens;

    let mut eos = Request::new(p.clone(), 40);
    eos.stop_ids = vec![free[5]];
    let got = run_alone(false, 4, eos);
    let at = free.iter().position(|&t| t == free[5]).unwrap();
    assert_eq!(got.tokens, free[..=at]);
    assert_eq!(got.reason, Some(FinishReason::Stop));

    let mut ignored = Request::new(p.clone(), 12);
    ignored.stop_ids = vec![free[5]];
    ignored.ignore_eos = true;
    let got = run_alone(false, 4, ignored);
    assert_eq!(got.tokens, free[..12]);
    assert_eq!(got.reason, Some(FinishReason::Length));

    let mut seq = Request::new(p, 40);
    seq.ignore_eos = true;
    seq.stop_sequences = vec![vec![], free[10..13].to_vec()];
    let got = run_alone(false, 4, seq);
    let end = (3..=free.len())
        .find(|&n| free[..n].ends_with(&free[10..13]))
        .unwrap();
    assert_eq!(got.tokens, free[..end]);
    assert_eq!(got.reason, Some(FinishReason::Stop));
}

/// Logprobs of the raw distribution with every token of a sampled request, whether the
/// model scores the token where its logits are (up to `MAX_TOP_LOGPROBS` top ones) or
/// returns the logits and the host scores it (more than that): the same tokens either way.
#[test]
fn logprobs_describe_the_raw_distribution() {
    let mut streams = Vec::new();
    for top in [3, MAX_TOP_LOGPROBS + 5] {
        let p = prompt(5, 6);
        let cfg = fake_config(false);
        let kv = pool(&cfg, 32, 0, 4, CacheType::Radix);
        let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(2, 16, 16)).unwrap();
        let mut r = Request::new(p.clone(), 6);
        r.sampling = sampled(3);
        r.ignore_eos = true;
        r.logprobs = Some(top);
        let id = sched.submit(r);
        let mut seq = p;
        while sched.has_work() {
            for e in sched.step() {
                assert_eq!(e.id, id);
                if let EventKind::Token {
                    token,
                    logprob,
                    top_logprobs: got,
                } = e.kind
                {
                    let logits = logits_for(&seq);
                    assert_eq!(logprob, Some(logprob_of(&logits, token)));
                    assert_eq!(got, top_logprobs(&logits, top));
                    assert_eq!(got.len(), top.min(VOCAB));
                    seq.push(token);
                }
            }
        }
        assert_eq!(seq.len(), 11);
        streams.push(seq);
    }
    assert_eq!(streams[0], streams[1]);
}

#[test]
fn impossible_requests_finish_with_an_error_and_others_carry_on() {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 8, 8, 4, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(4, 16, 8)).unwrap();
    let mut bad_sampling = Request::new(prompt(3, 1), 5);
    bad_sampling.sampling.temperature = -1.0;
    let reqs = vec![
        Request::new(prompt(20, 1), 20), // 40 tokens > 8 pages of 4
        Request::new(vec![], 5),
        Request::new(vec![1, VOCAB as u32], 5),
        bad_sampling,
        Request::new(prompt(4, 2), 0),
        Request::new(prompt(6, 3), 10),
    ];
    let (ids, out) = run_all(&mut sched, reqs);
    for id in &ids[..4] {
        assert!(
            matches!(out[id].reason, Some(FinishReason::Error(_))),
            "{:?}",
            out[id]
        );
        assert!(out[id].tokens.is_empty());
    }
    assert_eq!(out[&ids[4]].reason, Some(FinishReason::Length));
    assert!(out[&ids[4]].tokens.is_empty());
    assert_eq!(out[&ids[5]].tokens.len(), 10);
    assert_pool_clean(sched.pool_mut());
}

#[test]
fn a_tight_pool_preempts_and_outputs_stay_the_same() {
    for windowed in [false, true] {
        let cfg = fake_config(windowed);
        // Six requests of up to 48 tokens in 16 pages of 4 tokens (64 tokens).
        let kv = pool(&cfg, 16, 16, 4, CacheType::Radix);
        let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(6, 32, 8)).unwrap();
        let reqs: Vec<Request> = (0..6)
            .map(|i| {
                let mut r = Request::new(prompt(8 + 2 * i, i as u32), 40 - 3 * i);
                r.ignore_eos = true;
                r.sampling = sampled(i as u64);
                r
            })
            .collect();
        let alone: Vec<Vec<u32>> = (0..6)
            .map(|i| {
                let mut r = Request::new(prompt(8 + 2 * i, i as u32), 40 - 3 * i);
                r.ignore_eos = true;
                r.sampling = sampled(i as u64);
                run_alone(windowed, 4, r).tokens
            })
            .collect();
        let (ids, out) = run_all(&mut sched, reqs);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(out[id].reason, Some(FinishReason::Length));
            assert_eq!(out[id].tokens, alone[i], "request {i}");
        }
        assert!(
            sched.status().preemptions > 0,
            "the pool was meant to run out"
        );
        assert_pool_clean(sched.pool_mut());
    }
}

/// Records each batch's shape around the fake model; fails the forward of chosen steps.
struct Watched {
    inner: FakeModel,
    batches: Vec<Vec<(usize, usize)>>,
    fail_on: Option<usize>,
    /// Launches that took their tokens from the step before (overlapped).
    fed: usize,
}

impl StepModel for Watched {
    type Launched = ForwardOutput;

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn finish(&mut self, step: ForwardOutput) -> Result<ForwardOutput, SchedError> {
        Ok(step)
    }

    fn launch(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        batch: &ForwardBatch,
        fed: Option<&ForwardOutput>,
    ) -> Result<ForwardOutput, SchedError> {
        self.fed += usize::from(fed.is_some());
        self.batches.push(
            batch
                .seqs
                .iter()
                .map(|s| (s.start, s.tokens.len()))
                .collect(),
        );
        if self.fail_on == Some(self.batches.len()) {
            return Err(SchedError::Other("device lost".into()));
        }
        self.inner.launch(kv, batch, fed)
    }

    fn feeds(&self, step: &ForwardOutput) -> bool {
        self.inner.feeds(step)
    }
}

fn watched(fail_on: Option<usize>) -> (Watched, KvPool<HostStorage>) {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 128, 128, 4, CacheType::Radix);
    let model = Watched {
        inner: FakeModel::new(cfg),
        batches: Vec::new(),
        fail_on,
        fed: 0,
    };
    (model, kv)
}

#[test]
fn batches_respect_the_budgets() {
    let (model, kv) = watched(None);
    let mut sched = Scheduler::new(model, kv, config(3, 10, 4)).unwrap();
    for i in 0..7 {
        let mut r = Request::new(prompt(5 + 3 * i, i as u32), 6);
        r.ignore_eos = true;
        sched.submit(r);
    }
    let mut out = HashMap::new();
    while sched.has_work() {
        common::record(&mut out, sched.step());
        assert!(sched.status().running <= 3);
    }
    assert_eq!(out.len(), 7);
    assert!(out.values().all(|o| o.tokens.len() == 6));
    let batches = &sched.model().batches;
    assert!(
        batches.iter().any(|b| b.len() == 3),
        "requests were batched"
    );
    for b in batches {
        assert!(b.iter().map(|c| c.1).sum::<usize>() <= 10, "{b:?}");
        assert!(b.iter().all(|c| c.1 <= 4), "{b:?}");
    }
}

#[test]
fn a_failed_forward_ends_only_the_requests_in_it() {
    let (model, kv) = watched(Some(3));
    let mut sched = Scheduler::new(model, kv, config(2, 8, 8)).unwrap();
    let mut reqs: Vec<Request> = (0..4).map(|i| Request::new(prompt(4, i), 5)).collect();
    reqs.iter_mut().for_each(|r| r.ignore_eos = true);
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut out = HashMap::new();
    drain_generic(&mut sched, &mut out);
    for id in &ids[..2] {
        assert_eq!(
            out[id].reason,
            Some(FinishReason::Error("device lost".into()))
        );
    }
    for id in &ids[2..] {
        assert_eq!(out[id].reason, Some(FinishReason::Length));
        assert_eq!(out[id].tokens.len(), 5);
    }
    assert_pool_clean(sched.pool_mut());
}

fn drain_generic<M: StepModel>(sched: &mut Scheduler<M>, out: &mut HashMap<SeqId, Outcome>) {
    drain(sched, out)
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let cfg = fake_config(false);
    let bad = [config(0, 8, 8), config(4, 8, 0), config(8, 4, 8)];
    for c in bad {
        let kv = pool(&cfg, 8, 0, 4, CacheType::Radix);
        assert!(Scheduler::new(FakeModel::new(cfg.clone()), kv, c).is_err());
    }
    assert!(SchedulerConfig::default().validate().is_ok());
}

/// A request that runs to `max_tokens` whatever it generates.
fn past_eos(prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut r = Request::new(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

fn overlapped(max_running: usize, batch: usize, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        overlap: true,
        ..config(max_running, batch, chunk)
    }
}

/// A greedy prompt whose solo run stops on EOS before `max_tokens`.
fn prompt_stopping_early(max_tokens: usize) -> Vec<u32> {
    (0..200)
        .map(|salt| prompt(6, 100 + salt))
        .find(|p| {
            let t = reference_tokens(p, max_tokens, &SamplingParams::greedy(), 7, true);
            t.len() > 1 && t.len() < max_tokens && t.last() == Some(&EOS)
        })
        .expect("some prompt stops early")
}

/// Greedy, sampled, logprob, stop-string, early-EOS and length-stopped requests together:
/// each request's output is its solo run's whether decode steps are overlapped or not.
/// Overlapped, the steps that follow all-greedy ones take their tokens from them, and a
/// request that stops on EOS has a queued row whose output is dropped.
#[test]
fn overlapped_decode_steps_give_the_solo_outputs() {
    let early = prompt_stopping_early(20);
    let requests = || {
        let mut reqs = Vec::new();
        let mut r = Request::new(early.clone(), 20);
        r.stop_ids = vec![EOS];
        reqs.push(r);
        for (i, max) in [3usize, 9, 20].into_iter().enumerate() {
            reqs.push(past_eos(prompt(4 + i, i as u32), max));
        }
        let mut r = Request::new(prompt(5, 7), 12);
        r.sampling = sampled(3);
        reqs.push(r);
        let mut r = Request::new(prompt(7, 8), 6);
        r.logprobs = Some(2);
        reqs.push(r);
        let mut r = Request::new(prompt(3, 9), 15);
        r.ignore_eos = true;
        r.stop_sequences = vec![vec![3]];
        reqs.push(r);
        reqs
    };
    for windowed in [false, true] {
        let alone: Vec<Outcome> = requests()
            .into_iter()
            .map(|r| run_alone(windowed, 4, r))
            .collect();
        assert_eq!(alone[0].reason, Some(FinishReason::Stop));
        for overlap in [false, true] {
            let cfg = fake_config(windowed);
            let kv = pool(&cfg, 128, 128, 4, CacheType::Radix);
            let mut model = watched(None).0;
            model.inner = FakeModel::new(cfg);
            let c = if overlap {
                overlapped(8, 64, 8)
            } else {
                config(8, 64, 8)
            };
            let mut sched = Scheduler::new(model, kv, c).unwrap();
            let ids: Vec<SeqId> = requests().into_iter().map(|r| sched.submit(r)).collect();
            let mut out = HashMap::new();
            drain_generic(&mut sched, &mut out);
            assert_eq!(sched.model().fed > 0, overlap, "windowed {windowed}");
            for (id, want) in ids.iter().zip(&alone) {
                let got = &out[id];
                let what = format!("windowed {windowed} overlap {overlap}");
                assert_eq!(got.tokens, want.tokens, "{what}");
                assert_eq!(got.reason, want.reason, "{what}");
                assert_eq!(got.logprobs, want.logprobs, "{what}");
            }
            assert_pool_clean(sched.pool_mut());
        }
    }
}

/// A request cancelled while a step that holds it is queued ends at once; its row's output
/// is dropped, the other request runs on as if alone, and no page is left held.
#[test]
fn cancelling_during_an_overlapped_step() {
    let (model, kv) = watched(None);
    let mut sched = Scheduler::new(model, kv, overlapped(4, 16, 8)).unwrap();
    let request = |i: u32| past_eos(prompt(5, 20 + i), 12);
    let ids: Vec<SeqId> = (0..2).map(|i| sched.submit(request(i))).collect();
    let mut out = HashMap::new();
    while sched.model().fed < 2 {
        common::record(&mut out, sched.step());
    }
    assert!(sched.cancel(ids[0]));
    drain_generic(&mut sched, &mut out);
    assert_eq!(out[&ids[0]].reason, Some(FinishReason::Cancelled));
    let alone: Vec<Outcome> = (0..2).map(|i| run_alone(true, 4, request(i))).collect();
    assert!(alone[0].tokens.starts_with(&out[&ids[0]].tokens));
    assert_eq!(out[&ids[1]].tokens, alone[1].tokens);
    assert_pool_clean(sched.pool_mut());
}

/// A queued step that fails to launch gives its slots back and the step is planned again
/// the ordinary way: nobody loses a token.
#[test]
fn a_failed_overlapped_launch_is_planned_again() {
    let (model, kv) = watched(Some(4));
    let mut sched = Scheduler::new(model, kv, overlapped(2, 8, 8)).unwrap();
    let request = |i: u32| past_eos(prompt(4, 30 + i), 6);
    let ids: Vec<SeqId> = (0..2).map(|i| sched.submit(request(i))).collect();
    let mut out = HashMap::new();
    drain_generic(&mut sched, &mut out);
    assert!(sched.model().fed > 0);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(out[id].tokens, run_alone(true, 4, request(i as u32)).tokens);
        assert_eq!(out[id].reason, Some(FinishReason::Length));
    }
    assert_pool_clean(sched.pool_mut());
}

/// Each prompt token's logprob given the tokens before it, from the fake's logits.
fn expected_prompt_scores(prompt: &[u32], top: usize) -> Vec<TokenLogprobs> {
    (1..prompt.len())
        .map(|i| token_logprobs(&logits_for(&prompt[..i]), prompt[i], top))
        .collect()
}

#[test]
fn prompt_logprobs_score_every_prompt_token_once() {
    for (chunk, cache) in [
        (64, CacheType::Radix),
        (3, CacheType::Radix),
        (5, CacheType::Naive),
    ] {
        let cfg = fake_config(true);
        let kv = pool(&cfg, 64, 64, 4, cache);
        let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(4, 64, chunk)).unwrap();
        let p = prompt(21, 2);
        // Cached first: a scoring request must compute its prompt all the same.
        run_all(&mut sched, vec![Request::new(p.clone(), 2)]);
        let mut echo_only = Request::new(p.clone(), 0);
        echo_only.prompt_logprobs = Some(3);
        let mut echo_and_one = Request::new(p.clone(), 1);
        echo_and_one.prompt_logprobs = Some(0);
        echo_and_one.logprobs = Some(1);
        let (ids, out) = run_all(&mut sched, vec![echo_only, echo_and_one]);
        let (a, b) = (&out[&ids[0]], &out[&ids[1]]);
        assert_eq!(
            a.prompt_scores,
            expected_prompt_scores(&p, 3),
            "chunk {chunk}"
        );
        assert_eq!(
            b.prompt_scores,
            expected_prompt_scores(&p, 0),
            "chunk {chunk}"
        );
        assert_eq!(
            (a.tokens.len(), a.reason.clone()),
            (0, Some(FinishReason::Length))
        );
        assert_eq!((a.prompt_tokens, a.cached_tokens), (21, 0));
        let greedy = SamplingParams::greedy();
        assert_eq!(b.tokens, reference_tokens(&p, 1, &greedy, 7, true));
        assert_eq!(
            b.logprobs,
            vec![Some(logprob_of(&logits_for(&p), b.tokens[0]))]
        );
        assert_pool_clean(sched.pool_mut());
    }
}

#[test]
fn prompt_logprobs_survive_preemption() {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 16, 16, 4, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(6, 32, 8)).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(8 + 2 * i, i as u32)).collect();
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = Request::new(p.clone(), 40 - 3 * i);
            r.ignore_eos = true;
            r.prompt_logprobs = Some(2);
            r
        })
        .collect();
    let (ids, out) = run_all(&mut sched, reqs);
    assert!(
        sched.status().preemptions > 0,
        "the pool was meant to run out"
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            out[id].prompt_scores,
            expected_prompt_scores(&prompts[i], 2)
        );
        assert_eq!(out[id].completion_tokens, 40 - 3 * i);
    }
    assert_pool_clean(sched.pool_mut());
}

/// Allows only even ids and is complete after `left` tokens.
struct EvenIds {
    left: usize,
}

impl strata_sched::TokenConstraint for EvenIds {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        for (id, l) in logits.iter_mut().enumerate() {
            if id % 2 == 1 {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn allowed(&mut self, vocab: usize) -> Result<Vec<u32>, String> {
        Ok(vec![0x5555_5555; vocab.div_ceil(32)])
    }
    fn commit(&mut self, token: u32) -> Result<bool, String> {
        if token % 2 == 1 {
            return Err(format!("{token} was not allowed"));
        }
        self.left -= 1;
        Ok(self.left == 0)
    }
    fn fork(&self) -> Box<dyn strata_sched::TokenConstraint> {
        Box::new(EvenIds { left: self.left })
    }
}

#[test]
fn a_constraint_masks_every_draw_and_ends_the_request() {
    let cfg = fake_config(true);
    let kv = pool(&cfg, 64, 64, 4, CacheType::Radix);
    let mut sched = Scheduler::new(FakeModel::new(cfg), kv, config(4, 64, 8)).unwrap();
    let p = prompt(11, 4);
    let reqs = [SamplingParams::greedy(), sampled(3)].map(|sampling| {
        let mut r = Request::new(p.clone(), 20);
        r.ignore_eos = true;
        r.sampling = sampling;
        r.logprobs = Some(0);
        r.constraint = Some(strata_sched::Constraint::new(EvenIds { left: 6 }));
        r
    });
    let (ids, out) = run_all(&mut sched, reqs.into());
    for (id, params) in ids.iter().zip([SamplingParams::greedy(), sampled(3)]) {
        let o = &out[id];
        assert_eq!(o.reason, Some(FinishReason::Stop));
        // The plain loop over masked logits; logprobs stay those of the raw distribution.
        let mut tokens = p.clone();
        for (i, &t) in o.tokens.iter().enumerate() {
            let raw = logits_for(&tokens);
            let mut masked = raw.clone();
            strata_sched::TokenConstraint::mask(&mut EvenIds { left: 1 }, &mut masked).unwrap();
            let uniform =
                strata_types::sampling::draw_uniform(params.seed_or(7), tokens.len() as u64);
            assert_eq!(
                t,
                strata_types::sampling::sample(&masked, &params, uniform).unwrap(),
                "token {i}"
            );
            assert_eq!(o.logprobs[i], Some(logprob_of(&raw, t)));
            tokens.push(t);
        }
        assert_eq!(o.tokens.len(), 6);
    }
    assert_pool_clean(sched.pool_mut());
}
