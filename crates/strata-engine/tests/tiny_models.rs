//! The real forward pass on the tiny transformers fixtures: generation of several requests
//! batched together (chunked prefill, shared prefixes, a pool small enough to preempt),
//! greedy or sampled, equals each request generated alone; so does greedy generation in
//! speculative rounds with the tiny Gemma-4 assistant; logit controls applied with the
//! model's pick (overlapped steps, rounds) equal the host's draw from the logits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_kernels::cpu::CpuBackend;
use strata_kernels::sampling::{LogitControls, SamplingParams};
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{Assistant, Drafting, LoadOptions, Model, ModelHandle, ModelRunner};
use strata_sched::{
    Constraint, EventKind, FinishReason, PromptLookup, Request, Scheduler, SchedulerConfig, SeqId,
    StepModel, TokenConstraint,
};

fn fixture(name: &str) -> PathBuf {
    std::env::var_os("STRATA_TINY_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny"))
        .join(name)
}

fn model(name: &str) -> Model<CpuBackend> {
    Model::load(CpuBackend::new(), &fixture(name)).expect("fixture loads")
}

/// A fixture as the scheduler drives it.
fn load(name: &str) -> ModelRunner<Model<CpuBackend>> {
    ModelRunner(model(name))
}

/// The tiny Gemma-4 target with its tiny assistant, drafting `k` tokens a round.
fn drafting(k: usize) -> Drafting<Model<CpuBackend>> {
    let model = model("gemma4-tiny");
    let assistant = Assistant::load(
        model.backend().clone(),
        &fixture("gemma4-tiny-assistant"),
        model.config(),
        LoadOptions::default(),
    )
    .expect("assistant loads");
    Drafting::new(model, Arc::new(assistant), k)
}

fn scheduler<M: StepModel + ModelOf>(
    model: M,
    pages: usize,
    page_size: usize,
    config: SchedulerConfig,
) -> Scheduler<M> {
    let layout = KvLayout::for_config(model.config_of(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: pages,
        window: pages,
        page_size,
    };
    let pool = KvPool::new(layout, plan, CacheType::Radix, HostStorage::new()).unwrap();
    Scheduler::new(model, pool, config).unwrap()
}

/// The configuration a test pool is laid out for.
trait ModelOf {
    fn config_of(&self) -> &strata_config::ModelConfig;
}

impl ModelOf for ModelRunner<Model<CpuBackend>> {
    fn config_of(&self) -> &strata_config::ModelConfig {
        self.0.config()
    }
}

impl ModelOf for Drafting<Model<CpuBackend>> {
    fn config_of(&self) -> &strata_config::ModelConfig {
        self.target().model().config()
    }
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

/// Greedy requests of 8 to 28 tokens out: as the short ones finish, few enough are left
/// for speculative rounds of up to two requests.
fn greedy_staggered() -> Vec<Request> {
    requests(false)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.max_tokens = 8 + 5 * i;
            r
        })
        .collect()
}

/// `greedy_staggered` through `sched`: together, or one at a time when rounds hold one
/// request (so that each runs its rounds alone).
fn generate_staggered<M: StepModel<S>, S: strata_kv::KvStorage>(
    sched: &mut Scheduler<M, S>,
    max_requests: usize,
) -> Vec<Vec<u32>> {
    if max_requests == 1 {
        greedy_staggered()
            .into_iter()
            .map(|r| generate(sched, vec![r]).remove(0))
            .collect()
    } else {
        generate(sched, greedy_staggered())
    }
}

/// As `greedy_staggered`, 40 tokens longer each: long enough for the tiny models' greedy
/// text to fall into the loops prompt lookup follows.
fn greedy_long() -> Vec<Request> {
    let mut reqs = greedy_staggered();
    for r in &mut reqs {
        r.max_tokens += 40;
    }
    reqs
}

/// The sampled requests (each seeded), 40 tokens longer each.
fn sampled_long() -> Vec<Request> {
    let mut reqs = requests(true);
    for r in &mut reqs {
        r.max_tokens += 40;
    }
    reqs
}

/// A grammar stand-in: after `n` tokens it allows the ids `t` with
/// `(t + n % cycle) % period == 0`, on the host (`mask`) and as bits for a device
/// (`allowed`) alike.
#[derive(Clone)]
struct Stride {
    n: usize,
    cycle: usize,
    period: usize,
}

impl Stride {
    /// A third of the ids, a different third at each token.
    fn thirds(n: usize) -> Self {
        Self {
            n,
            cycle: 3,
            period: 3,
        }
    }

    /// Four ids, alternating between two sets: text that repeats, so that lookups
    /// find drafts.
    fn few(n: usize) -> Self {
        Self {
            n,
            cycle: 2,
            period: 128,
        }
    }

    fn allows(&self, t: usize) -> bool {
        (t + self.n % self.cycle).is_multiple_of(self.period)
    }
}

impl TokenConstraint for Stride {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        for (t, x) in logits.iter_mut().enumerate() {
            if !self.allows(t) {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn allowed(&mut self, vocab: usize) -> Result<Vec<u32>, String> {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for t in (0..vocab).filter(|&t| self.allows(t)) {
            words[t / 32] |= 1 << (t % 32);
        }
        Ok(words)
    }
    fn commit(&mut self, _: u32) -> Result<bool, String> {
        self.n += 1;
        Ok(false)
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// Greedy and sampled long requests with logit controls (penalties over prompt and
/// completion, biases); with `on_host`, each also asks for logprobs, which keeps its draw
/// on the host (the logprobs stay the raw row's), the reference path.
fn controlled(on_host: bool) -> Vec<Request> {
    let mut reqs: Vec<Request> = greedy_long().into_iter().take(3).collect();
    reqs.extend(sampled_long().into_iter().take(2));
    for (i, r) in reqs.iter_mut().enumerate() {
        r.controls = LogitControls {
            presence_penalty: 0.4,
            frequency_penalty: [0.0, 0.6, 1.1][i % 3],
            repetition_penalty: [1.3, 1.0, 0.9][i % 3],
            logit_bias: vec![(7, 2.0), (11, -100.0)],
            min_tokens: 0,
        };
        if on_host {
            r.logprobs = Some(0);
        }
    }
    reqs
}

/// `controlled` requests through `sched` (overlapped, maybe drafting) equal `want`, the
/// host's draws; the overlapped steps and rounds ran, and the controls changed the output.
fn controls_match<M: StepModel<S>, S: strata_kv::KvStorage>(
    sched: &mut Scheduler<M, S>,
    want: &[Vec<u32>],
    rounds: bool,
    what: &str,
) {
    let got = generate(sched, controlled(false));
    assert_eq!(got, want, "{what}");
    let st = sched.status();
    assert!(st.overlapped_steps > 0, "{what}: {st:?}");
    assert!(!rounds || st.drafts.rounds > 0, "{what}: {st:?}");
    let bare: Vec<Request> = controlled(false)
        .into_iter()
        .map(|r| Request {
            controls: LogitControls::default(),
            ..r
        })
        .collect();
    assert_ne!(
        generate(sched, bare),
        got,
        "{what}: the controls change nothing"
    );
    eprintln!("{what}: controls with the pick equal the host's draws; {st:?}");
}

/// Requests under [`Stride`] masks: greedy and sampled, two with logit controls as well,
/// beside two requests without a mask (whose prompts share steps with the masked decodes);
/// with `on_host`, the masked ones ask for logprobs, which keeps their draws on the host.
fn masked(on_host: bool) -> Vec<Request> {
    let mut reqs = controlled(false);
    for (i, r) in reqs.iter_mut().enumerate() {
        if i % 2 == 0 {
            r.controls = LogitControls::default();
        }
        r.constraint = Some(Constraint::new(Stride::thirds(i)));
        if on_host {
            r.logprobs = Some(0);
        }
    }
    reqs.extend(greedy_long().into_iter().skip(3));
    reqs
}

/// Three requests under [`Stride::few`] alone (greedy, greedy with controls, sampled), so
/// that every round has masked rows; with `on_host`, they ask for logprobs (drawn on the
/// host).
fn masked_alone(on_host: bool) -> Vec<Request> {
    let mut reqs: Vec<Request> = masked(on_host).into_iter().take(3).collect();
    for (i, r) in reqs.iter_mut().enumerate() {
        r.constraint = Some(Constraint::new(Stride::few(i)));
    }
    reqs
}

/// What a run of [`masks_match`] must show of speculative rounds.
#[derive(Clone, Copy, PartialEq)]
enum Rounds {
    /// None asked for.
    Off,
    /// Some ran.
    Ran,
    /// Some kept drafts.
    Kept,
}

/// `reqs` (`masked` or `masked_alone`) through `sched`: their tokens equal `want` (the
/// host's draws) and follow the masks; the masks went to the model (`/metrics`' count),
/// and speculative rounds ran under them as `rounds` asks.
fn masks_match<M: StepModel<S>, S: strata_kv::KvStorage>(
    sched: &mut Scheduler<M, S>,
    (reqs, want): (Vec<Request>, &[Vec<u32>]),
    rounds: Rounds,
    what: &str,
) {
    let mut strides = Vec::new();
    for r in &reqs {
        let Some(c) = &r.constraint else { break };
        strides.push(c.clone());
    }
    let got = generate(sched, reqs);
    assert_eq!(got, want, "{what}");
    for (i, (tokens, mut c)) in got.iter().zip(strides).enumerate() {
        for &t in tokens {
            let allowed = c.0.allowed(512).unwrap();
            assert!(
                (allowed[t as usize / 32] >> (t % 32)) & 1 == 1,
                "{what}: request {i} drew {t}"
            );
            c.0.commit(t).unwrap();
        }
    }
    let st = sched.status();
    // Masks came for steps queued ahead of their reads as well.
    assert!(
        st.masks.masks > 0 && st.overlapped_steps > 0,
        "{what}: {st:?}"
    );
    assert!(
        rounds != Rounds::Ran || st.drafts.rounds > 0,
        "{what}: {st:?}"
    );
    assert!(
        rounds != Rounds::Kept || st.drafts.accepted > 0,
        "{what}: {st:?}"
    );
    eprintln!(
        "{what}: masked picks equal the host's draws; {:?} {:?}",
        st.masks, st.drafts
    );
}

/// On the CPU backend: grammar masks computed while the step runs (for an overlapped step,
/// once the step before it is read) and applied with the model's pick (with logit controls
/// before them) give the tokens the host draws; so do prompt-lookup and assistant rounds,
/// whose checked rows take the masks after the drafts before them.
#[test]
fn grammar_masks_with_the_pick_equal_the_host_draw() {
    for name in ["gemma4-tiny", "llama-tiny"] {
        let mut host = scheduler(load(name), 256, 4, controls_config(None));
        let want = generate(&mut host, masked(true));
        let mut s = scheduler(load(name), 256, 4, controls_config(None));
        masks_match(&mut s, (masked(false), &want), Rounds::Off, name);
        // Few ids allowed: overlapped steps whose adjustments count the token ahead (its
        // penalty decides between the allowed ids).
        let mut host = scheduler(load(name), 256, 4, controls_config(None));
        let want = generate(&mut host, masked_alone(true));
        let mut s = scheduler(load(name), 256, 4, controls_config(None));
        let what = format!("{name}, few ids");
        masks_match(&mut s, (masked_alone(false), &want), Rounds::Off, &what);
        if name == "gemma4-tiny" {
            // Masked text seldom repeats a pair: lookups match single tokens.
            let lookup = Some(PromptLookup::new(1, 3));
            let mut s = scheduler(load(name), 256, 4, controls_config(lookup));
            let what = format!("{name}, prompt lookup");
            masks_match(&mut s, (masked_alone(false), &want), Rounds::Kept, &what);
            let mut s = scheduler(drafting(3), 256, 4, controls_config(None));
            // The random assistant seldom drafts an allowed id: its rounds run, drafts refused.
            let what = "gemma4-tiny, assistant";
            masks_match(&mut s, (masked_alone(false), &want), Rounds::Ran, what);
        }
    }
}

/// The scheduler settings of the logit-control checks: overlapped steps, rounds of up to
/// five requests when drafting.
fn controls_config(lookup: Option<PromptLookup>) -> SchedulerConfig {
    SchedulerConfig {
        max_running_requests: 5,
        max_batch_tokens: 32,
        prefill_chunk: 3,
        seed: 1,
        overlap: true,
        draft_max_requests: 5,
        prompt_lookup: lookup,
    }
}

/// On the CPU backend: penalties and biases applied with the model's pick (decode steps,
/// overlapped steps counting the token ahead from the feeding step, prompt-lookup and
/// assistant rounds counting the drafts) give the tokens the host draws from the logits.
#[test]
fn logit_controls_with_the_pick_equal_the_host_draw() {
    for name in ["gemma4-tiny", "llama-tiny"] {
        let mut host = scheduler(load(name), 256, 4, controls_config(None));
        let want = generate(&mut host, controlled(true));
        let mut s = scheduler(load(name), 256, 4, controls_config(None));
        controls_match(&mut s, &want, false, name);
        // The penalties keep the tiny Llama's text from looping: lookups find nothing
        // there, so the rounds run on Gemma-4 alone.
        if name == "gemma4-tiny" {
            let lookup = Some(PromptLookup::new(2, 3));
            let mut s = scheduler(load(name), 256, 4, controls_config(lookup));
            controls_match(&mut s, &want, true, &format!("{name}, prompt lookup"));
            let mut s = scheduler(drafting(3), 256, 4, controls_config(None));
            controls_match(&mut s, &want, true, "gemma4-tiny, assistant");
        }
    }
}

/// Each of `reqs` alone on a roomy pool of model `name`, without drafts.
fn each_alone(name: &str, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    reqs.into_iter()
        .map(|r| {
            let mut s = scheduler(load(name), 64, 4, SchedulerConfig::default());
            generate(&mut s, vec![r]).remove(0)
        })
        .collect()
}

fn generate<M: StepModel<S>, S: strata_kv::KvStorage>(
    sched: &mut Scheduler<M, S>,
    reqs: Vec<Request>,
) -> Vec<Vec<u32>> {
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| sched.submit(r)).collect();
    let mut tokens: HashMap<SeqId, Vec<u32>> = HashMap::new();
    while sched.has_work() {
        for e in sched.step() {
            match e.kind {
                EventKind::Token { token, .. } => tokens.entry(e.id).or_default().push(token),
                EventKind::Finished { reason, .. } => {
                    assert_eq!(reason, FinishReason::Length, "{:?}", e.id)
                }
                EventKind::PromptLogprobs { .. } => panic!("no request asked for them"),
            }
        }
        sched.pool().audit().unwrap();
    }
    ids.iter().map(|id| tokens.remove(id).unwrap()).collect()
}

fn batched_equals_alone(name: &str, sampled: bool) {
    let alone = each_alone(name, requests(sampled));
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
            ..SchedulerConfig::default()
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

/// The scheduler over device pools, against the same requests on the CPU.
#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use strata_kernels::cuda::CudaBackend;
    use strata_model::PagedStorage;

    /// The CUDA backend, or `None` after printing `skipped: no GPU` (a failure instead where
    /// `STRATA_REQUIRE_GPU` is set).
    fn gpu() -> Option<CudaBackend> {
        strata_kernels::gpu_test::gpu_or_skip(CudaBackend::new(0))
    }

    /// A scheduler over a device pool for `model` (laid out for `cfg`).
    fn device_scheduler<M: StepModel<PagedStorage<CudaBackend>>>(
        model: M,
        cfg: &strata_config::ModelConfig,
        backend: &CudaBackend,
        config: SchedulerConfig,
    ) -> Scheduler<M, PagedStorage<CudaBackend>> {
        let layout = KvLayout::for_config(cfg, KvCacheDtype::F32).unwrap();
        let plan = PagePlan {
            full: 64,
            window: 64,
            page_size: 4,
        };
        let storage = PagedStorage::new(backend.clone());
        let pool = KvPool::new(layout, plan, CacheType::Radix, storage).unwrap();
        Scheduler::new(model, pool, config).unwrap()
    }

    /// On the GPU (device pool, decode and verification graphs): grammar masks computed on
    /// the host while the step runs (or, in prompt-lookup rounds, after the drafts) and
    /// applied on the device with the pick give the host's draws.
    #[test]
    fn grammar_masks_on_the_gpu_equal_the_host_draw() {
        let Some(gpu) = gpu() else { return };
        for name in ["gemma4-tiny", "llama-tiny"] {
            let target = || Model::load(gpu.clone(), &fixture(name)).expect("fixture loads");
            let cfg = target().config().clone();
            let config = controls_config(None);
            let mut host = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            let want = generate(&mut host, masked(true));
            let mut s = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            let what = format!("GPU {name}");
            masks_match(&mut s, (masked(false), &want), Rounds::Off, &what);
            let mut host = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            let want = generate(&mut host, masked_alone(true));
            let mut s = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            let what = format!("GPU {name}, few ids");
            masks_match(&mut s, (masked_alone(false), &want), Rounds::Off, &what);
            if name == "gemma4-tiny" {
                // Rounds replay verification graphs, their rows masked after the drafts.
                let lookup = controls_config(Some(PromptLookup::new(1, 3)));
                let mut s = device_scheduler(ModelRunner(target()), &cfg, &gpu, lookup);
                let what = format!("GPU {name}, prompt lookup");
                masks_match(&mut s, (masked_alone(false), &want), Rounds::Kept, &what);
            }
        }
    }

    /// On the GPU (device pool, decode and verification graphs): logit controls applied
    /// on the device with the pick, in overlapped steps and in prompt-lookup and assistant
    /// rounds, give the tokens the host draws from the same device's logits.
    #[test]
    fn logit_controls_on_the_gpu_equal_the_host_draw() {
        let Some(gpu) = gpu() else { return };
        for name in ["gemma4-tiny", "llama-tiny"] {
            let target = || Model::load(gpu.clone(), &fixture(name)).expect("fixture loads");
            let cfg = target().config().clone();
            let config = controls_config(None);
            let mut host = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            let want = generate(&mut host, controlled(true));
            let mut s = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
            controls_match(&mut s, &want, false, &format!("GPU {name}"));
            eprintln!(
                "GPU {name}: {} decode graphs",
                s.pool().storage().graph_count()
            );
            if name == "gemma4-tiny" {
                let lookup = controls_config(Some(PromptLookup::new(2, 3)));
                let mut s = device_scheduler(ModelRunner(target()), &cfg, &gpu, lookup);
                controls_match(&mut s, &want, true, &format!("GPU {name}, prompt lookup"));
                let assistant = Assistant::load(
                    gpu.clone(),
                    &fixture("gemma4-tiny-assistant"),
                    &cfg,
                    LoadOptions::default(),
                )
                .expect("assistant loads");
                let model = Drafting::new(target(), Arc::new(assistant), 3);
                let mut s = device_scheduler(model, &cfg, &gpu, config);
                controls_match(&mut s, &want, true, "GPU gemma4-tiny, assistant");
            }
        }
    }

    /// On the GPU (device pool, decode, draft-round and verification graphs): greedy requests
    /// in speculative rounds, one at a time and several a round, give the tokens the GPU gives
    /// without drafts.
    #[test]
    fn gemma4_speculative_rounds_on_the_gpu_equal_plain_gpu_decoding() {
        let Some(gpu) = gpu() else { return };
        let target = || Model::load(gpu.clone(), &fixture("gemma4-tiny")).expect("fixture loads");
        let cfg = target().config().clone();
        let config = SchedulerConfig {
            max_running_requests: 5,
            max_batch_tokens: 32,
            prefill_chunk: 3,
            seed: 1,
            overlap: true,
            draft_max_requests: 5,
            prompt_lookup: None,
        };
        let mut plain = device_scheduler(ModelRunner(target()), &cfg, &gpu, config);
        let want = generate(&mut plain, greedy_staggered());
        let cpu = {
            let mut s = scheduler(load("gemma4-tiny"), 64, 4, SchedulerConfig::default());
            generate(&mut s, greedy_staggered())
        };
        eprintln!("plain GPU tokens equal the CPU's: {}", want == cpu);
        for (k, max_requests) in [(3, 1), (2, 5), (4, 2)] {
            let assistant = Assistant::load(
                gpu.clone(),
                &fixture("gemma4-tiny-assistant"),
                &cfg,
                LoadOptions::default(),
            )
            .expect("assistant loads");
            let model = Drafting::new(target(), Arc::new(assistant), k);
            let config = SchedulerConfig {
                draft_max_requests: max_requests,
                ..config
            };
            let mut s = device_scheduler(model, &cfg, &gpu, config);
            let got = generate_staggered(&mut s, max_requests);
            assert_eq!(got, want, "k {k}, rounds of up to {max_requests}");
            let d = s.status().drafts;
            assert!(d.rounds > 0 && d.drafted > 0, "k {k}: {d:?}");
            eprintln!(
                "GPU k {k}, up to {max_requests} a round: {d:?}, {} decode graphs, {} draft graphs",
                s.pool().storage().graph_count(),
                s.pool().storage().draft_graph_count()
            );
        }
        // Prompt lookup: the scheduler's own drafts, checked by the target alone (the tiny
        // Llama, whose greedy text loops).
        let llama = || Model::load(gpu.clone(), &fixture("llama-tiny")).expect("fixture loads");
        let llama_cfg = llama().config().clone();
        let mut plain = device_scheduler(ModelRunner(llama()), &llama_cfg, &gpu, config);
        let want = generate(&mut plain, greedy_long());
        for max_requests in [2, 5] {
            let config = SchedulerConfig {
                draft_max_requests: max_requests,
                prompt_lookup: Some(PromptLookup::new(3, 3)),
                ..config
            };
            let mut s = device_scheduler(ModelRunner(llama()), &llama_cfg, &gpu, config);
            let got = generate(&mut s, greedy_long());
            assert_eq!(got, want, "prompt lookup, rounds of up to {max_requests}");
            // Sampled requests (seeded): the verification's rows drawn on the device.
            let mut plain = device_scheduler(
                ModelRunner(llama()),
                &llama_cfg,
                &gpu,
                SchedulerConfig {
                    prompt_lookup: None,
                    ..config
                },
            );
            let want_sampled = generate(&mut plain, sampled_long());
            let got_sampled = generate(&mut s, sampled_long());
            assert_eq!(
                got_sampled, want_sampled,
                "sampled, rounds of up to {max_requests}"
            );
            let d = s.status().drafts;
            assert!(d.rounds > 0 && d.accepted > 0, "lookup: {d:?}");
            eprintln!(
                "GPU k lookup, up to {max_requests} a round: {d:?}, {} decode graphs",
                s.pool().storage().graph_count()
            );
        }
    }
}

/// Greedy requests in speculative rounds (one at a time, then up to five a round, on a
/// roomy pool and on one that preempts) give the tokens of each request alone without
/// drafts; rounds ran and drafted.
#[test]
fn gemma4_speculative_rounds_equal_alone() {
    let alone = each_alone("gemma4-tiny", greedy_staggered());
    for (k, max_requests, pages) in [(3, 1, 64), (2, 5, 64), (4, 2, 64), (4, 5, 14)] {
        let config = SchedulerConfig {
            max_running_requests: 5,
            max_batch_tokens: 32,
            prefill_chunk: 3,
            seed: 1,
            overlap: true,
            draft_max_requests: max_requests,
            prompt_lookup: None,
        };
        let mut s = scheduler(drafting(k), pages, 4, config);
        let batched = generate_staggered(&mut s, max_requests);
        assert_eq!(batched, alone, "k {k}, rounds of up to {max_requests}");
        let d = s.status().drafts;
        assert!(d.rounds > 0 && d.drafted > 0, "k {k}: {d:?}");
        eprintln!("k {k}, up to {max_requests} a round, {pages} pages: {d:?}");
    }
}

/// Drafts by prompt lookup through the real forward pass (the tiny models' greedy text
/// falls into loops, which the lookup follows): the tokens of each request alone.
#[test]
fn prompt_lookup_rounds_equal_alone() {
    let long = greedy_long;
    for name in ["gemma4-tiny", "llama-tiny"] {
        let sampled_alone = each_alone(name, sampled_long());
        let alone = each_alone(name, long());
        for (max_requests, pages) in [(5, 64), (2, 64), (5, 30)] {
            let config = SchedulerConfig {
                max_running_requests: 5,
                max_batch_tokens: 32,
                prefill_chunk: 3,
                seed: 1,
                overlap: true,
                draft_max_requests: max_requests,
                prompt_lookup: Some(PromptLookup::new(3, 3)),
            };
            let mut s = scheduler(load(name), pages, 4, config);
            let got = generate(&mut s, long());
            assert_eq!(got, alone, "{name}, rounds of up to {max_requests}");
            let got = generate(&mut s, sampled_long());
            assert_eq!(
                got, sampled_alone,
                "{name} sampled, rounds of up to {max_requests}"
            );
            let d = s.status().drafts;
            if max_requests == 5 && pages == 64 {
                assert!(d.rounds > 0 && d.drafted > 0, "{name}: {d:?}");
            }
            eprintln!("{name} lookup, up to {max_requests} a round, {pages} pages: {d:?}");
        }
    }
}

#[test]
fn the_scheduler_can_move_to_an_engine_thread() {
    fn is_send<T: Send>() {}
    is_send::<Scheduler<ModelRunner<Arc<Model<CpuBackend>>>>>();
    is_send::<Scheduler<Drafting<Arc<Model<CpuBackend>>>>>();
    is_send::<Request>();
}
