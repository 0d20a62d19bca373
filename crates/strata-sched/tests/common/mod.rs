//! A fake model whose logits are a function of the token sequence it reads back from the
//! KV pool, and helpers to run requests through a scheduler.
#![allow(dead_code)]

use serde_json::json;
use std::collections::HashMap;
use strata_config::ModelConfig;
use strata_types::sampling::{
    adjust_logits, draw_uniform, sample, token_logprobs, RowAdjust, RowDraw, SamplingParams,
    TokenLogprobs,
};

use strata_kv::{
    CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, ModelDtype, PagePlan, RequestId,
};
use strata_sched::{
    CheckRow, CheckedRow, DraftRow, Event, EventKind, FinishReason, Request, SchedError, Scheduler,
    SchedulerConfig, SeqId, StepModel,
};
use strata_types::sampling::FED_TOKEN;
use strata_types::{ForwardBatch, ForwardOutput, LogitsMode};

pub const VOCAB: usize = 16;
pub const EOS: u32 = 0;
pub const WINDOW: usize = 6;
/// K/V row length of every layer of the fake configurations.
const ROW: usize = 4;

/// Layers `[sliding, full, sliding, full]`, the last two KV-shared (sources 0 and 1), with
/// a window of `WINDOW` tokens; or, with `windowed = false`, four full-attention layers.
pub fn fake_config(windowed: bool) -> ModelConfig {
    let v = if windowed {
        json!({
            "model_type": "gemma4_text",
            "vocab_size": VOCAB, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 1, "num_key_value_heads": 1,
            "head_dim": ROW, "global_head_dim": ROW, "num_global_key_value_heads": null,
            "attention_k_eq_v": false, "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0}
            },
            "final_logit_softcapping": null, "tie_word_embeddings": true,
            "attention_bias": false, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": VOCAB, "num_kv_shared_layers": 2,
            "use_double_wide_mlp": false, "enable_moe_block": false,
            "use_bidirectional_attention": null,
            "pad_token_id": 0, "eos_token_id": 0, "bos_token_id": 2, "dtype": "float32"
        })
    } else {
        json!({
            "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": ROW, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": false, "torch_dtype": "float32"
        })
    };
    ModelConfig::from_hf_json(&v.to_string()).expect("fake config parses")
}

pub fn pool(
    cfg: &ModelConfig,
    full: usize,
    window: usize,
    page_size: usize,
    cache: CacheType,
) -> KvPool<HostStorage> {
    let layout = KvLayout::new(cfg, KvCacheDtype::F32, ModelDtype::F32).unwrap();
    let window = if layout.window().is_some() { window } else { 0 };
    let plan = PagePlan {
        full,
        window,
        page_size,
    };
    KvPool::new(layout, plan, cache, HostStorage::new()).unwrap()
}

/// The K/V row stored for `token` at `position` in `layer`: exact in f32, so a read that
/// lands on the wrong slot, page or layer is recognised.
fn kv_row(token: u32, position: usize, layer: usize) -> [f32; ROW] {
    let check = (token as usize * 31 + position * 7 + layer) % 101;
    [token as f32, position as f32, layer as f32, check as f32]
}

/// Next-token logits after `tokens`: a hash of the whole sequence spread over the vocabulary.
pub fn logits_for(tokens: &[u32]) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (0..VOCAB as u64)
        .map(|v| {
            let mut z = h ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^= z >> 29;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
        })
        .collect()
}

/// Stores K/V like a real model and computes its logits from the tokens it reads back:
/// every position of full layers, the last `WINDOW` of sliding ones (through their shared
/// readers as well). Anything wrong in the pool changes the output or fails the read.
pub struct FakeModel {
    pub cfg: ModelConfig,
    pub forwards: usize,
    pub tokens_computed: usize,
    /// Speculative rounds, when set.
    pub drafter: Option<FakeDrafter>,
    /// Steps that checked drafts made by the scheduler (prompt lookup).
    pub verified_rounds: usize,
    /// Per request, the position its next round may draft from (the latest round's only).
    kept: HashMap<RequestId, usize>,
    /// When set, the greedy token repeats the token this far back (a text that repeats
    /// itself, which prompt lookup guesses right) once the sequence is that long.
    pub period: Option<usize>,
}

/// Drafts the fake's true greedy continuation, each token wrong (the next id instead)
/// with a chance of `miss_percent` in 100, drawn from a hash of the sequence so far.
#[derive(Clone, Copy, Debug)]
pub struct FakeDrafter {
    pub tokens: usize,
    pub miss_percent: u64,
    pub rounds: usize,
    pub drafted: usize,
}

impl FakeDrafter {
    pub fn new(tokens: usize, miss_percent: u64) -> Self {
        Self {
            tokens,
            miss_percent,
            rounds: 0,
            drafted: 0,
        }
    }

    fn propose(&self, seq: &[u32]) -> u32 {
        let right = strata_types::sampling::argmax(&logits_for(seq));
        let mut h: u64 = 0x51ED;
        for &t in seq {
            h = (h ^ t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        if (h >> 33) % 100 < self.miss_percent {
            (right + 1) % VOCAB as u32
        } else {
            right
        }
    }
}

impl FakeModel {
    pub fn new(cfg: ModelConfig) -> Self {
        Self {
            cfg,
            forwards: 0,
            tokens_computed: 0,
            verified_rounds: 0,
            drafter: None,
            kept: HashMap::new(),
            period: None,
        }
    }

    /// A fake whose text repeats with `period` (see `FakeModel::period`).
    pub fn repeating(cfg: ModelConfig, period: usize) -> Self {
        Self {
            period: Some(period),
            ..Self::new(cfg)
        }
    }

    /// The logits after `seq`: `logits_for`, or with `period`, the same with the token
    /// `period` back lifted above every other.
    pub fn next_logits(&self, seq: &[u32]) -> Vec<f32> {
        let mut l = logits_for(seq);
        if let Some(p) = self.period.filter(|&p| seq.len() >= p) {
            l[seq[seq.len() - p] as usize] = 10.0;
        }
        l
    }

    pub fn drafting(cfg: ModelConfig, drafter: FakeDrafter) -> Self {
        Self {
            drafter: Some(drafter),
            ..Self::new(cfg)
        }
    }

    /// Stores `inputs` at `start..` and picks the token after each, as a device would:
    /// greedy, or drawn (and scored) for the rows of `draws`.
    fn check(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        req: RequestId,
        start: usize,
        inputs: &[u32],
        (draws, adjust): (&[RowDraw], &[RowAdjust]),
    ) -> Result<CheckedRow, SchedError> {
        self.store(kv, req, start, inputs)?;
        let mut picked = Vec::with_capacity(inputs.len());
        let mut scores = Vec::with_capacity(inputs.len());
        for j in 0..inputs.len() {
            let mut logits = self.next_logits(&self.read_sequence(kv, req, start + j)?);
            // As `DraftRow::adjust` has it: row j counts the j drafts before it.
            if let Some(a) = adjust.iter().find(|a| a.row == j) {
                let mut a = a.clone();
                a.pending.extend_from_slice(&inputs[1..=j]);
                adjust_logits(&mut logits, &a.resolved(&[]));
            }
            match draws.iter().find(|d| d.row == j) {
                Some(d) => {
                    let t = sample(&logits, &d.params, d.uniform)
                        .map_err(|e| SchedError::Other(e.to_string()))?;
                    picked.push(t);
                    scores.push(d.logprobs.map(|n| token_logprobs(&logits, t, n)));
                }
                None => {
                    picked.push(strata_types::sampling::argmax(&logits));
                    scores.push(None);
                }
            }
        }
        Ok(CheckedRow {
            drafts: inputs[1..].to_vec(),
            picked,
            logprobs: if draws.is_empty() { Vec::new() } else { scores },
        })
    }

    /// Writes the K/V of `tokens` at `start..` of `req`.
    fn store(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        req: RequestId,
        start: usize,
        tokens: &[u32],
    ) -> Result<(), SchedError> {
        for (i, &t) in tokens.iter().enumerate() {
            let pos = start + i;
            for l in 0..self.cfg.layers.len() {
                let row = kv_row(t, pos, l);
                let slot = kv
                    .slot(req, pos)
                    .map_err(|e| SchedError::Other(e.to_string()))?;
                kv.write_kv(l, slot, &row, &row)
                    .map_err(|e| SchedError::Other(e.to_string()))?;
            }
        }
        self.tokens_computed += tokens.len();
        Ok(())
    }

    fn read_sequence(
        &self,
        kv: &KvPool<HostStorage>,
        req: strata_kv::RequestId,
        query: usize,
    ) -> Result<Vec<u32>, SchedError> {
        let mut tokens: Option<Vec<u32>> = None;
        let bad = |m: String| SchedError::Other(format!("fake model: {m}"));
        for (l, layer) in self.cfg.layers.iter().enumerate() {
            let from = layer.window.map_or(0, |w| (query + 1).saturating_sub(w));
            let n = query + 1 - from;
            let (mut k, mut v) = (vec![0.0; n * ROW], vec![0.0; n * ROW]);
            for (i, pos) in (from..query + 1).enumerate() {
                let slot = kv.slot(req, pos).map_err(|e| bad(e.to_string()))?;
                let r = i * ROW..(i + 1) * ROW;
                kv.read_kv(l, slot, &mut k[r.clone()], &mut v[r])
                    .map_err(|e| bad(e.to_string()))?;
            }
            let source = self.cfg.kv_layer_for(l);
            let mut seen = Vec::new();
            for (i, (row, vrow)) in k.chunks(ROW).zip(v.chunks(ROW)).enumerate() {
                let pos = from + i;
                let token = row[0] as u32;
                if row != kv_row(token, pos, source) || row != vrow {
                    return Err(bad(format!("layer {l} position {pos} holds {row:?}")));
                }
                seen.push(token);
            }
            match &tokens {
                None if from == 0 => tokens = Some(seen),
                None => {}
                Some(all) if all[from..] != seen[..] => {
                    return Err(bad(format!("layer {l} disagrees on tokens {from}..")));
                }
                Some(_) => {}
            }
        }
        tokens.ok_or_else(|| bad("no full-attention layer".into()))
    }
}

/// Replaces the fed marks of `batch` by `fed`'s greedy tokens, as a device would.
pub fn resolve_fed(
    batch: &ForwardBatch,
    fed: Option<&ForwardOutput>,
) -> Result<ForwardBatch, SchedError> {
    let mut batch = batch.clone();
    for t in batch.seqs.iter_mut().flat_map(|s| s.tokens.iter_mut()) {
        if *t & FED_TOKEN != 0 {
            let row = (*t & !FED_TOKEN) as usize;
            *t = fed
                .and_then(|f| f.tokens.get(row).copied().flatten())
                .ok_or_else(|| SchedError::Other(format!("fed token {row} is missing")))?;
        }
    }
    Ok(batch)
}

impl StepModel for FakeModel {
    /// The output itself: the fake computes on the host, at launch.
    type Launched = ForwardOutput;

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn launch(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        batch: &ForwardBatch,
        fed: Option<&ForwardOutput>,
    ) -> Result<ForwardOutput, SchedError> {
        // What a device reads for marked pending tokens: the feeding step's picks.
        let fed_ids: Vec<u32> = fed.map_or(Vec::new(), |f| {
            f.tokens.iter().map(|t| t.unwrap_or(0)).collect()
        });
        let batch = &resolve_fed(batch, fed)?;
        self.forwards += 1;
        let mut row = 0;
        for s in &batch.seqs {
            self.store(kv, s.request, s.start, &s.tokens)?;
        }
        let mut logits = Vec::with_capacity(batch.seqs.len());
        let mut tokens = Vec::with_capacity(batch.seqs.len());
        let mut scores = Vec::with_capacity(batch.seqs.len());
        for s in &batch.seqs {
            let end = s.start + s.tokens.len();
            let rows = match s.logits {
                LogitsMode::None => s.start..s.start,
                LogitsMode::Last | LogitsMode::Argmax | LogitsMode::Draw { .. } => end - 1..end,
                LogitsMode::All => s.start..end,
            };
            let mut out = Vec::new();
            for q in rows {
                let seq = self.read_sequence(kv, s.request, q)?;
                let mut l = self.next_logits(&seq);
                // As a device would: adjusted before the pick (`ForwardBatch::adjust`).
                if let Some(a) = batch.adjust.iter().find(|a| a.row == row) {
                    adjust_logits(&mut l, &a.resolved(&fed_ids));
                }
                out.extend(l);
                row += 1;
            }
            let mut score = None;
            if s.logits == LogitsMode::Argmax {
                // As a device would: the greedy choice only, no logits.
                tokens.push(Some(strata_types::sampling::argmax(&out)));
                out.clear();
            } else if let LogitsMode::Draw {
                params,
                uniform,
                logprobs,
            } = s.logits
            {
                // As a device would: the drawn token (and its logprobs) only.
                let t =
                    sample(&out, &params, uniform).map_err(|e| SchedError::Other(e.to_string()))?;
                score = logprobs.map(|n| token_logprobs(&out, t, n));
                tokens.push(Some(t));
                out.clear();
            } else {
                tokens.push(None);
            }
            scores.push(score);
            logits.push(out);
        }
        Ok(ForwardOutput {
            vocab: VOCAB,
            logits,
            tokens,
            logprobs: scores,
        })
    }

    fn finish(&mut self, step: ForwardOutput) -> Result<ForwardOutput, SchedError> {
        Ok(step)
    }

    fn feeds(&self, step: &ForwardOutput) -> bool {
        !step.tokens.is_empty() && step.tokens.iter().all(Option::is_some)
    }

    fn draft_tokens(&self) -> usize {
        self.drafter.map_or(0, |d| d.tokens)
    }

    fn can_draft(&self, request: RequestId, position: usize) -> bool {
        self.kept.get(&request) == Some(&position)
    }

    /// Drafts from the tokens read back through the keys a query one position before the
    /// row's sees (what the scheduler committed must still be there), then checks every
    /// row as `LogitsMode::All` would.
    fn speculate(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        rows: &[DraftRow],
        _masks: &mut strata_sched::DraftMasks,
    ) -> Result<Vec<CheckedRow>, SchedError> {
        let mut drafter = self
            .drafter
            .ok_or_else(|| SchedError::Other("fake model: no drafter".into()))?;
        drafter.rounds += 1;
        self.forwards += 1;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            if r.drafts > 0 && !self.can_draft(r.request, r.start) {
                return Err(SchedError::Other(format!(
                    "fake model: drafts asked for {:?} at {} without its state",
                    r.request, r.start
                )));
            }
            let mut seq = self.read_sequence(kv, r.request, r.start - 1)?;
            seq.push(r.token);
            let mut drafts = Vec::with_capacity(r.drafts);
            for _ in 0..r.drafts {
                let t = drafter.propose(&seq);
                seq.push(t);
                drafts.push(t);
            }
            drafter.drafted += r.drafts;
            let inputs: Vec<u32> = std::iter::once(r.token)
                .chain(drafts.iter().copied())
                .collect();
            out.push(self.check(kv, r.request, r.start, &inputs, (&r.draws, &r.adjust))?);
        }
        self.kept.clear();
        for (r, c) in rows.iter().zip(&out) {
            self.kept.insert(r.request, r.start + c.agreed() + 1);
        }
        self.drafter = Some(drafter);
        Ok(out)
    }

    fn verifies(&self) -> bool {
        true
    }

    fn verify(
        &mut self,
        kv: &mut KvPool<HostStorage>,
        rows: &[CheckRow],
    ) -> Result<Vec<CheckedRow>, SchedError> {
        self.forwards += 1;
        self.verified_rounds += 1;
        rows.iter()
            .map(|r| self.check(kv, r.request, r.start, &r.tokens, (&r.draws, &r.adjust)))
            .collect()
    }
}

/// What one request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub reason: Option<FinishReason>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub logprobs: Vec<Option<f32>>,
    /// Prompt logprobs, from position 1 on.
    pub prompt_scores: Vec<TokenLogprobs>,
}

impl Outcome {
    fn new() -> Self {
        Self {
            tokens: Vec::new(),
            reason: None,
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
            logprobs: Vec::new(),
            prompt_scores: Vec::new(),
        }
    }
}

/// Folds `events` into per-request outcomes, checking that nothing follows `Finished`.
pub fn record(outcomes: &mut HashMap<SeqId, Outcome>, events: Vec<Event>) {
    for e in events {
        let o = outcomes.entry(e.id).or_insert_with(Outcome::new);
        assert!(o.reason.is_none(), "event after Finished for {:?}", e.id);
        match e.kind {
            EventKind::Token { token, logprob, .. } => {
                o.tokens.push(token);
                o.logprobs.push(logprob);
            }
            EventKind::PromptLogprobs { start, scores } => {
                assert!(o.tokens.is_empty(), "prompt logprobs after a token");
                assert_eq!(
                    start,
                    o.prompt_scores.len() + 1,
                    "prompt logprobs out of order"
                );
                o.prompt_scores.extend(scores);
            }
            EventKind::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                o.reason = Some(reason);
                o.prompt_tokens = prompt_tokens;
                o.completion_tokens = completion_tokens;
                o.cached_tokens = cached_tokens;
            }
        }
    }
}

/// Steps until nothing is left, auditing the pool after every step.
pub fn drain<M: StepModel>(sched: &mut Scheduler<M>, outcomes: &mut HashMap<SeqId, Outcome>) {
    let mut steps = 0;
    while sched.has_work() {
        record(outcomes, sched.step());
        if let Err(e) = sched.pool().audit() {
            panic!("pool audit after step {steps}: {e}");
        }
        steps += 1;
        assert!(steps < 100_000, "the scheduler does not finish");
    }
}

/// Runs one request alone on a roomy fresh pool, whole prompt in one chunk, no prefix cache.
pub fn run_alone(windowed: bool, page_size: usize, req: Request) -> Outcome {
    let cfg = fake_config(windowed);
    let pool = pool(&cfg, 512, 512, page_size, CacheType::Naive);
    let config = SchedulerConfig {
        max_running_requests: 1,
        max_batch_tokens: 4096,
        prefill_chunk: 4096,
        seed: 7,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(FakeModel::new(cfg), pool, config).unwrap();
    let id = sched.submit(req);
    let mut outcomes = Default::default();
    drain(&mut sched, &mut outcomes);
    outcomes.remove(&id).unwrap()
}

/// The generation loop written out directly over `logits_for`: what the scheduler must
/// reproduce (EOS and max_tokens stops only).
pub fn reference_tokens(
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    seed: u64,
    stop_at_eos: bool,
) -> Vec<u32> {
    let seed = params.seed_or(seed);
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let uniform = draw_uniform(seed, tokens.len() as u64);
        let t = sample(&logits_for(&tokens), params, uniform).unwrap();
        tokens.push(t);
        out.push(t);
        if stop_at_eos && t == EOS {
            break;
        }
    }
    out
}
