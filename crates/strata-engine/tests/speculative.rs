//! Speculative decoding through the engine's public interface: a Gemma-4 target with its
//! assistant gives exactly the target's greedy output.

use std::path::{Path, PathBuf};

use strata_engine::{Device, GenerateParams, LoadedModel};
use strata_kernels::sampling::SamplingParams;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

fn target_with_draft() -> LoadedModel {
    let mut m = LoadedModel::load(&fixture("gemma4-tiny"), Device::Cpu).unwrap();
    m.load_draft(&fixture("gemma4-tiny-assistant")).unwrap();
    m
}

#[test]
fn drafted_generation_is_the_greedy_generation() {
    let m = target_with_draft();
    for (prompt_len, max_tokens, draft_tokens) in [(9, 20, 3), (3, 17, 1), (30, 12, 5)] {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| (i * 101 + 7) % 512).collect();
        let params = |draft_tokens| GenerateParams {
            max_tokens,
            stop_at_eos: false,
            draft_tokens,
            // Small chunks: the prompt's last chunk is what the drafter starts from.
            prefill_chunk: 8,
            ..Default::default()
        };
        let plain = m.generate(&prompt, &params(0)).unwrap();
        assert!(plain.draft.is_none());
        let drafted = m.generate(&prompt, &params(draft_tokens)).unwrap();
        assert_eq!(
            drafted.tokens, plain.tokens,
            "prompt {prompt_len}, {draft_tokens} drafts"
        );
        assert_eq!(drafted.finish_reason, "length");
        // A round drafts at most `draft_tokens` (none in the first round after the
        // prompt, which only leaves the drafter its state; none while a request whose
        // drafts keep failing pauses them).
        let s = drafted.draft.expect("drafts were made");
        assert!(
            s.rounds > 0
                && s.drafted > 0
                && s.drafted <= s.rounds * draft_tokens as u64
                && s.accepted <= s.drafted,
            "{s:?}"
        );
        assert!(s.tokens_per_round() >= 1.0);
    }
}

#[test]
fn no_tokens_asked_none_given() {
    let m = target_with_draft();
    for draft_tokens in [0, 3] {
        let params = GenerateParams {
            max_tokens: 0,
            draft_tokens,
            ..Default::default()
        };
        let out = m.generate(&[4, 5, 6], &params).unwrap();
        assert!(
            out.tokens.is_empty(),
            "{draft_tokens} drafts: {:?}",
            out.tokens
        );
        assert_eq!(out.finish_reason, "length");
    }
}

#[test]
fn drafted_generation_stops_where_the_greedy_one_does() {
    let m = target_with_draft();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 13 + 2) % 512).collect();
    let plain = m
        .generate(
            &prompt,
            &GenerateParams {
                max_tokens: 16,
                stop_at_eos: false,
                draft_tokens: 0,
                ..Default::default()
            },
        )
        .unwrap()
        .tokens;
    // Any generated token can be made a stop token: the 6th here.
    let stop = plain[5];
    let mut m = m;
    m.stop_ids = vec![stop];
    let first = plain.iter().position(|&t| t == stop).unwrap();
    for draft_tokens in [0, 2, 4] {
        let out = m
            .generate(
                &prompt,
                &GenerateParams {
                    max_tokens: 16,
                    draft_tokens,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(out.tokens, plain[..=first], "{draft_tokens} drafts");
        assert_eq!(out.finish_reason, "stop");
    }
}

#[test]
fn drafted_sampling_with_a_seed_is_the_sampling_without_drafts() {
    let m = target_with_draft();
    let prompt: Vec<u32> = (0..10).map(|i| (i * 29 + 3) % 512).collect();
    for seed in [Some(7), None] {
        let params = |draft_tokens| GenerateParams {
            max_tokens: 18,
            stop_at_eos: false,
            draft_tokens,
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: 20,
                seed,
                ..SamplingParams::greedy()
            },
            ..Default::default()
        };
        let plain = m.generate(&prompt, &params(0)).unwrap();
        let drafted = m.generate(&prompt, &params(3)).unwrap();
        assert_eq!(drafted.tokens, plain.tokens, "seed {seed:?}");
        assert!(drafted.draft.expect("drafts were made").rounds > 0);
    }
}

#[test]
fn prompt_lookup_keeps_the_output_and_drafts_where_the_text_repeats() {
    let m = LoadedModel::load(&fixture("llama-tiny"), Device::Cpu).unwrap();
    // A prompt that repeats itself: lookup finds its last tokens earlier in it.
    let unit: Vec<u32> = (0..7).map(|i| (i * 41 + 11) % 256).collect();
    let prompt: Vec<u32> = unit.iter().cycle().take(30).copied().collect();
    let params = |prompt_lookup| GenerateParams {
        max_tokens: 24,
        stop_at_eos: false,
        draft_tokens: 4,
        prompt_lookup,
        ..Default::default()
    };
    let plain = m.generate(&prompt, &params(None)).unwrap();
    assert!(plain.draft.is_none());
    let looked_up = m.generate(&prompt, &params(Some(3))).unwrap();
    assert_eq!(looked_up.tokens, plain.tokens);
    let s = looked_up.draft.expect("lookup drafted");
    assert!(s.rounds > 0 && s.drafted > 0, "{s:?}");

    let err = target_with_draft()
        .generate(&prompt, &params(Some(3)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not both"), "{err}");
    let err = m
        .generate(&prompt, &params(Some(0)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt lookup"), "{err}");
}

#[test]
fn drafts_are_refused_for_foreign_targets() {
    let mut llama = LoadedModel::load(&fixture("llama-tiny"), Device::Cpu).unwrap();
    let err = llama
        .load_draft(&fixture("gemma4-tiny-assistant"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_type"), "{err}");
    let mut gemma = LoadedModel::load(&fixture("gemma4-tiny"), Device::Cpu).unwrap();
    let err = gemma
        .load_draft(&fixture("llama-tiny"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_type"), "{err}");
}

/// Serves `prompts` (greedy, `max_tokens` each, all submitted together) through an engine
/// thread and returns each one's tokens and the engine's draft figures.
fn serve(
    loaded: LoadedModel,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    draft_tokens: usize,
) -> (Vec<Vec<u32>>, strata_sched::DraftStats) {
    use strata_engine::{Engine, EngineOptions, GenerationRequest, Update};
    let opts = EngineOptions {
        kv_budget_bytes: 8 << 20,
        draft_tokens,
        ..Default::default()
    };
    let engine = Engine::start(loaded, "tiny".into(), opts).unwrap();
    let pending: Vec<_> = prompts
        .iter()
        .map(|p| {
            let req = GenerationRequest {
                ignore_eos: true,
                ..GenerationRequest::new(p.clone(), max_tokens)
            };
            engine.submit(req).unwrap()
        })
        .collect();
    let mut out = Vec::new();
    for (mut guard, mut rx) in pending {
        let mut tokens = Vec::new();
        loop {
            match rx.blocking_recv().expect("the engine answers") {
                Update::Token { id, .. } => tokens.push(id),
                Update::PromptLogprobs { .. } => {}
                Update::Finished { reason, error, .. } => {
                    assert_eq!((reason, error), ("length", None));
                    guard.finished();
                    break;
                }
            }
        }
        out.push(tokens);
    }
    (out, engine.status().drafts)
}

/// The engine thread with a drafter (`strata serve --draft`): requests served together
/// in speculative rounds give the tokens the engine gives without drafts.
#[test]
fn served_requests_with_drafts_equal_plain_serving() {
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|r| {
            (0..5 + 4 * r)
                .map(|i| (i * 37 + r * 11 + 3) % 512)
                .collect()
        })
        .collect();
    let (plain, none) = serve(target_with_draft(), &prompts, 14, 0);
    assert_eq!(none.rounds, 0);
    for k in [1, 3] {
        let (drafted, stats) = serve(target_with_draft(), &prompts, 14, k);
        assert_eq!(drafted, plain, "{k} drafts a round");
        assert!(stats.rounds > 0 && stats.drafted > 0, "{stats:?}");
    }
}
