//! How many tokens a step takes, and how many of one prompt, where the command line does
//! not say: `strata serve` and `strata generate` share these defaults, so one prompt is
//! computed in the same chunks by both.

use strata_sched::SchedulerConfig;

/// A step's token budget where `--max-batch-tokens` is not given. On a GPU the prompts of
/// many arrivals share one step: a mixed step's fixed cost (the decode rows beside them, the
/// launches of the prompts' layers) is paid once for up to 16 prompts of 512, which served
/// E2B at concurrency 100 about 3% faster than 2048 (`docs/perf-notes.md`, "A step's token
/// budget on a GPU"). On the CPU a step's time grows with its tokens, and a
/// smaller budget keeps the decoding requests' gaps short.
pub fn step_tokens(arg: Option<usize>, on_gpu: bool) -> usize {
    arg.unwrap_or(if on_gpu {
        GPU_STEP_TOKENS
    } else {
        SchedulerConfig::default().max_batch_tokens
    })
}

/// A GPU step budget (see [`step_tokens`]).
const GPU_STEP_TOKENS: usize = 8192;

/// One request's prompt tokens a step where `--prefill-chunk` is not given. On a GPU a
/// prompt may fill the whole step: in chunks of 512 a long prompt pays the host's queueing
/// and the layers' fixed costs once a chunk, and a 4,096-token prompt's first token came in
/// 29-30 ms instead of 18-19 (`docs/perf-notes.md`, "A step's token budget on a GPU").
/// On the CPU the chunk stays short, so that a long prompt does not stall the requests
/// decoding beside it for long.
pub fn chunk_tokens(arg: Option<usize>, on_gpu: bool, step_tokens: usize) -> usize {
    arg.unwrap_or(if on_gpu {
        step_tokens
    } else {
        SchedulerConfig::default().prefill_chunk
    })
}

#[cfg(test)]
mod tests {
    /// Without `--max-batch-tokens` a GPU server's steps take up to 8192 tokens and a CPU
    /// server's 2048; a given budget holds on either.
    #[test]
    fn the_step_budget_follows_the_device_unless_given() {
        assert_eq!(super::step_tokens(None, true), 8192);
        assert_eq!(super::step_tokens(None, false), 2048);
        assert_eq!(super::step_tokens(Some(300), true), 300);
        assert_eq!(super::step_tokens(Some(300), false), 300);
    }

    /// Without `--prefill-chunk` a GPU server gives one prompt the whole step and a CPU
    /// server 512 tokens of it; a given chunk holds on either.
    #[test]
    fn a_prompts_chunk_follows_the_device_unless_given() {
        assert_eq!(super::chunk_tokens(None, true, 8192), 8192);
        assert_eq!(super::chunk_tokens(None, true, 3000), 3000);
        assert_eq!(super::chunk_tokens(None, false, 2048), 512);
        assert_eq!(super::chunk_tokens(Some(64), true, 8192), 64);
        assert_eq!(super::chunk_tokens(Some(64), false, 2048), 64);
    }
}
