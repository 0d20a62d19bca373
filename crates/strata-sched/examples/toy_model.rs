//! The scheduler over a toy model written here, with no device code anywhere: the model's
//! only rule is that token `t` is followed by `(t + 1) % 16`. Three requests of different
//! lengths share the steps (prefill chunks of at most 4 tokens beside decode tokens) over a
//! KV pool in host memory; every step's events are printed.
use strata_config::ModelConfig;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_sched::{Request, SchedError, Scheduler, SchedulerConfig, StepModel};
use strata_types::{ForwardBatch, ForwardOutput, LogitsMode};

const VOCAB: usize = 16;

struct Counting;

impl StepModel for Counting {
    type Launched = ForwardOutput; // computed at launch: nothing is left to wait for

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn launch(
        &mut self,
        _kv: &mut KvPool<HostStorage>, // where a real model stores each token's K/V
        batch: &ForwardBatch,
        _fed: Option<&ForwardOutput>,
    ) -> Result<ForwardOutput, SchedError> {
        let tokens = batch.seqs.iter().map(|seq| {
            let next = (seq.tokens.last().copied().unwrap_or(0) + 1) % VOCAB as u32;
            match seq.logits {
                LogitsMode::None => Ok(None), // a prompt chunk that is not its last
                LogitsMode::Argmax => Ok(Some(next)), // a greedy request: its token, no logits
                other => Err(SchedError::Other(format!("{other:?}"))), // not asked below
            }
        });
        let tokens = tokens.collect::<Result<Vec<_>, _>>()?;
        let n = tokens.len();
        Ok(ForwardOutput {
            vocab: VOCAB,
            logits: vec![vec![]; n],
            tokens,
            logprobs: vec![None; n],
        })
    }

    fn finish(&mut self, step: ForwardOutput) -> Result<ForwardOutput, SchedError> {
        Ok(step)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The pool's layout comes from a model configuration: 2 layers, 1 KV head of 4.
    let cfg = ModelConfig::from_hf_json(
        r#"{"model_type": "llama", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 4096}"#,
    )?;
    let layout = KvLayout::for_config(&cfg, KvCacheDtype::F32)?;
    let plan = PagePlan {
        full: 32,
        window: 0,
        page_size: 4,
    };
    let pool = KvPool::new(layout, plan, CacheType::Radix, HostStorage::new())?;
    let config = SchedulerConfig {
        prefill_chunk: 4,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(Counting, pool, config)?;
    for (prompt, max_tokens) in [(vec![3], 2), (vec![7, 8, 9, 10, 11, 12], 3), (vec![14], 4)] {
        let id = sched.submit(Request::new(prompt, max_tokens));
        println!("submitted {id:?}");
    }
    let mut step = 0;
    while sched.has_work() {
        step += 1;
        for event in sched.step() {
            println!("step {step}: {:?} {:?}", event.id, event.kind);
        }
    }
    Ok(())
}
