//! Logit controls through the scheduler over the fake model: every token follows the rules
//! written out here over the request's own tokens (bias, repetition over prompt and
//! completion, frequency and presence over the completion, the `min_tokens` mask), with
//! `stop_token_ids` ending the request; alone, batched with others, and with prompt lookup.
//! The controls go with the model's pick (`ForwardBatch::adjust`), in overlapped steps (the
//! token ahead counted from the feeding step) and in speculative rounds (each checked row
//! counting the drafts before it); a draft is kept only where it equals the adjusted draw.

mod common;

use std::collections::HashMap;

use common::{drain, fake_config, pool, FakeModel, Outcome, EOS};
use strata_kv::CacheType;
use strata_sched::{FinishReason, PromptLookup, Request, Scheduler, SchedulerConfig};
use strata_types::sampling::{draw_uniform, sample, LogitControls, SamplingParams};

const SEED: u64 = 7;

/// The generation loop with the controls written out over `model`'s logits.
fn reference(req: &Request, model: &FakeModel) -> (Vec<u32>, FinishReason) {
    let c = &req.controls;
    let mut tokens = req.prompt.clone();
    let mut out: Vec<u32> = Vec::new();
    loop {
        let mut l = model.next_logits(&tokens);
        for &(t, b) in &c.logit_bias {
            l[t as usize] += b;
        }
        for (t, x) in l.iter_mut().enumerate() {
            let t = t as u32;
            if tokens.contains(&t) {
                *x = if *x > 0.0 {
                    *x / c.repetition_penalty
                } else {
                    *x * c.repetition_penalty
                };
            }
            let count = out.iter().filter(|&&o| o == t).count();
            let present = if count > 0 { c.presence_penalty } else { 0.0 };
            *x = *x - c.frequency_penalty * count as f32 - present;
        }
        if out.len() < c.min_tokens {
            for &t in req.stop_ids.iter().chain(&req.stop_token_ids) {
                l[t as usize] = f32::NEG_INFINITY;
            }
        }
        let seed = req.sampling.seed_or(SEED);
        let t = sample(&l, &req.sampling, draw_uniform(seed, tokens.len() as u64)).unwrap();
        tokens.push(t);
        out.push(t);
        if req.stop_ids.contains(&t) || req.stop_token_ids.contains(&t) {
            return (out, FinishReason::Stop);
        }
        if out.len() == req.max_tokens {
            return (out, FinishReason::Length);
        }
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize, controls: LogitControls) -> Request {
    Request {
        stop_ids: vec![EOS],
        controls,
        ..Request::new(prompt, max_tokens)
    }
}

fn requests() -> Vec<Request> {
    let warm = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(3),
        ..SamplingParams::greedy()
    };
    let mut penalised = request(
        vec![1, 2, 3, 1, 2],
        24,
        LogitControls {
            presence_penalty: 0.6,
            frequency_penalty: 0.9,
            repetition_penalty: 1.7,
            ..LogitControls::default()
        },
    );
    penalised.sampling = warm;
    // EOS made likely, then held back for 6 tokens.
    let held = request(
        vec![4, 5],
        20,
        LogitControls {
            logit_bias: vec![(EOS, 4.0), (9, -100.0)],
            min_tokens: 6,
            ..LogitControls::default()
        },
    );
    // A stop id made likely once min_tokens is reached.
    let mut stopped = request(
        vec![6, 7, 8],
        20,
        LogitControls {
            logit_bias: vec![(11, 3.5)],
            min_tokens: 2,
            repetition_penalty: 0.8,
            ..LogitControls::default()
        },
    );
    stopped.stop_token_ids = vec![11];
    stopped.ignore_eos = true;
    stopped.stop_ids.clear();
    let plain = request(vec![2, 9, 4], 12, LogitControls::default());
    // Greedy and penalised: on the repeating model its loops last a few rounds each, so
    // drafts are kept and the penalty of each checked row counts the drafts before it.
    let looping = request(
        vec![3, 1, 4, 1, 5, 9, 2, 6],
        48,
        LogitControls {
            frequency_penalty: 1.5,
            presence_penalty: 0.5,
            ..LogitControls::default()
        },
    );
    vec![penalised, held, stopped, plain, looping]
}

fn run(
    model: FakeModel,
    reqs: Vec<Request>,
    lookup: Option<PromptLookup>,
    max_running: usize,
) -> (Vec<Outcome>, strata_sched::SchedStatus) {
    let cfg = model.cfg.clone();
    let kv = pool(&cfg, 256, 256, 4, CacheType::Radix);
    let config = SchedulerConfig {
        max_running_requests: max_running,
        max_batch_tokens: 64,
        prefill_chunk: 8,
        seed: SEED,
        overlap: true,
        draft_max_requests: 8,
        prompt_lookup: lookup,
    };
    let mut sched = Scheduler::new(model, kv, config).unwrap();
    let ids: Vec<_> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut out = HashMap::new();
    drain(&mut sched, &mut out);
    let outcomes = ids.iter().map(|id| out.remove(id).unwrap()).collect();
    (outcomes, sched.status())
}

#[test]
fn tokens_follow_the_written_out_rules() {
    let plain = FakeModel::new(fake_config(true));
    let want: Vec<_> = requests().iter().map(|r| reference(r, &plain)).collect();
    // The controls matter: without them the answers differ.
    for (r, w) in requests().into_iter().zip(&want).take(3) {
        let bare = Request {
            controls: LogitControls::default(),
            stop_token_ids: Vec::new(),
            ..r
        };
        assert_ne!(reference(&bare, &plain).0, w.0);
    }
    let (held, stopped) = (&want[1], &want[2]);
    assert!(
        held.0.len() > 6 && held.1 == FinishReason::Stop && held.0[..6].iter().all(|&t| t != EOS)
    );
    assert!(stopped.1 == FinishReason::Stop && stopped.0.last() == Some(&11));
    // A model whose text repeats every 2 tokens, so that prompt lookup's drafts are kept
    // until the penalties break the loop.
    let repeating = || FakeModel::repeating(fake_config(true), 2);
    type MakeModel = fn() -> FakeModel;
    let models: [(&str, MakeModel); 2] = [
        ("plain", || FakeModel::new(fake_config(true))),
        ("repeating", repeating),
    ];
    for (name, model) in models {
        let want: Vec<_> = requests().iter().map(|r| reference(r, &model())).collect();
        for (lookup, max_running) in [(None, 1), (None, 4), (Some(PromptLookup::new(2, 3)), 5)] {
            let (got, status) = run(model(), requests(), lookup, max_running);
            // The paths ran: steps queued ahead of their reads, and rounds.
            assert!(status.overlapped_steps > 0, "{name}: {status:?}");
            let d = status.drafts;
            if lookup.is_some() {
                assert!(d.rounds > 0 && d.accepted < d.drafted, "{name}: {d:?}");
                if name == "repeating" {
                    assert!(d.accepted > 0, "{name}: {d:?}");
                }
            }
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    (&g.tokens, g.reason.as_ref()),
                    (&w.0, Some(&w.1)),
                    "{name}: {lookup:?} {max_running}"
                );
            }
        }
    }
}
