//! The real forward pass on the tiny transformers fixtures: generation of several requests
//! batched together (chunked prefill, shared prefixes, a pool small enough to preempt),
//! greedy or sampled, equals each request generated alone.

use std::collections::HashMap;
use std::path::Path;

use strata_kernels::cpu::CpuBackend;
use strata_kernels::sampling::SamplingParams;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::Model;
use strata_sched::{EventKind, FinishReason, Request, Scheduler, SchedulerConfig, SeqId};

fn load(name: &str) -> Model<CpuBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name);
    Model::load(CpuBackend::new(), &dir).expect("fixture loads")
}

fn scheduler(
    model: Model<CpuBackend>,
    pages: usize,
    page_size: usize,
    config: SchedulerConfig,
) -> Scheduler<Model<CpuBackend>> {
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: pages,
        window: pages,
        page_size,
    };
    let pool = KvPool::new(layout, plan, CacheType::Radix, HostStorage::new()).unwrap();
    Scheduler::new(model, pool, config).unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    let system: Vec<u32> = (0..11).map(|i| 3 + (i * 37) % 500).collect();
    let mut out = Vec::new();
    for k in 0..4u32 {
        let mut p = system.clone();
        p.extend((0..2 + 3 * k).map(|i| 7 + (i * 53 + k * 101) % 500));
        out.push(p);
    }
    out.push(vec![5, 6, 7]);
    out
}

/// Greedy requests, or sampled ones (each with a seed of its own) with `sampled`.
fn requests(sampled: bool) -> Vec<Request> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| {
            let mut r = Request::new(prompt, 10);
            r.ignore_eos = true;
            if sampled {
                r.sampling = SamplingParams {
                    temperature: 0.9,
                    top_k: 50,
                    top_p: 0.95,
                    min_p: 0.01,
                    seed: Some(100 + i as u64),
                };
            }
            r
        })
        .collect()
}

fn generate(sched: &mut Scheduler<Model<CpuBackend>>, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut tokens: HashMap<SeqId, Vec<u32>> = HashMap::new();
    while sched.has_work() {
        for e in sched.step() {
            match e.kind {
                EventKind::Token { token, .. } => tokens.entry(e.id).or_default().push(token),
                EventKind::Finished { reason, .. } => {
                    assert_eq!(reason, FinishReason::Length, "{:?}", e.id)
                }
            }
        }
        sched.pool().audit().unwrap();
    }
    ids.iter().map(|id| tokens.remove(id).unwrap()).collect()
}

fn batched_equals_alone(name: &str, sampled: bool) {
    let alone: Vec<Vec<u32>> = requests(sampled)
        .into_iter()
        .map(|r| {
            let mut s = scheduler(load(name), 64, 4, SchedulerConfig::default());
            generate(&mut s, vec![r]).remove(0)
        })
        .collect();
    // 14 pages of 4 tokens for five requests of up to 30 tokens: chunks of 3 prompt
    // tokens, prefixes shared through the cache, and preemption.
    // With `overlap`, decode steps are queued one ahead, their ids fed from the step
    // before on the backend (drawn there for sampled requests).
    for overlap in [false, true] {
        let config = SchedulerConfig {
            max_running_requests: 5,
            max_batch_tokens: 12,
            prefill_chunk: 3,
            seed: 1,
            overlap,
        };
        let mut s = scheduler(load(name), 14, 4, config);
        let batched = generate(&mut s, requests(sampled));
        assert_eq!(batched, alone, "{name} overlap {overlap}");
        let status = s.status();
        assert!(status.kv.cache_hits > 0, "{name}: no prefix was reused");
        assert!(status.preemptions > 0, "{name}: the pool never ran out");
        assert_eq!(status.overlapped_steps > 0, overlap, "{name}");
    }
    // Roomy: every decode step after the prompts is overlapped.
    let config = SchedulerConfig {
        overlap: true,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(load(name), 64, 4, config);
    let batched = generate(&mut s, requests(sampled));
    assert_eq!(batched, alone, "{name} overlap, roomy");
    assert!(s.status().overlapped_steps >= 8, "{name}: {:?}", s.status());
}

#[test]
fn llama_batched_greedy_equals_alone() {
    batched_equals_alone("llama-tiny", false);
}

#[test]
fn gemma4_batched_greedy_equals_alone() {
    batched_equals_alone("gemma4-tiny", false);
}

#[test]
fn gemma4_batched_sampled_equals_alone() {
    batched_equals_alone("gemma4-tiny", true);
}

#[test]
fn the_scheduler_can_move_to_an_engine_thread() {
    fn is_send<T: Send>() {}
    is_send::<Scheduler<Model<CpuBackend>>>();
    is_send::<Request>();
}
