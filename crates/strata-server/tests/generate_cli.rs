//! `strata generate` through the real binary: the tiny Gemma-4 model (CPU), alone and with
//! its tiny assistant as the draft model, prompts given as token ids.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn tiny(name: &str) -> String {
    let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name);
    p.display().to_string()
}

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .unwrap()
}

/// `strata generate` on the tiny Gemma-4 model, 20 tokens after a short prompt.
fn generate(extra: &[&str]) -> Value {
    json_of(&generate_with(
        "gemma4-tiny",
        "5,9,300,17,2,8,77",
        20,
        extra,
    ))
}

/// `strata generate` on the tiny fixture `model`, printing JSON, past end-of-sequence.
fn generate_with(model: &str, prompt_ids: &str, max_tokens: usize, extra: &[&str]) -> Output {
    let (model, max_tokens) = (tiny(model), max_tokens.to_string());
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--prompt-ids",
        prompt_ids,
        "--max-tokens",
        &max_tokens,
        "--ignore-eos",
        "--json",
    ];
    args.extend_from_slice(extra);
    strata(&args)
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The prompt's chunking changes how many passes compute it, not what comes out: the CPU's
/// prefill gives every row the same bits whatever the rows beside it.
#[test]
fn the_prompts_chunk_does_not_change_the_tokens() {
    // 40 ids, so that chunks of 3 and 16 split the prompt over many passes.
    let ids: Vec<String> = (0..40u32)
        .map(|i| ((i * 37 + 11) % 480 + 3).to_string())
        .collect();
    let ids = ids.join(",");
    let whole = json_of(&generate_with("gemma4-tiny", &ids, 12, &[]))["tokens"].clone();
    assert_eq!(whole.as_array().unwrap().len(), 12);
    for chunk in ["3", "16", "40", "4096"] {
        let chunked = json_of(&generate_with(
            "gemma4-tiny",
            &ids,
            12,
            &["--prefill-chunk", chunk],
        ));
        assert_eq!(chunked["tokens"], whole, "--prefill-chunk {chunk}");
    }
}

/// A chunk of no tokens is refused with the flag named, not run or clamped.
#[test]
fn a_chunk_of_zero_tokens_is_refused() {
    let out = generate_with("gemma4-tiny", "1,2,3", 4, &["--prefill-chunk", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prefill-chunk must be at least 1"), "{err}");
}

#[test]
fn drafted_generation_prints_the_greedy_tokens_and_the_drafts_kept() {
    let plain = generate(&[]);
    assert!(plain["draft"].is_null());
    let assistant = tiny("gemma4-tiny-assistant");
    for k in ["1", "3"] {
        let drafted = generate(&["--draft", &assistant, "--draft-tokens", k]);
        assert_eq!(drafted["tokens"], plain["tokens"], "{k} drafts a round");
        let d = &drafted["draft"];
        let (rounds, drafted_n, kept) = (
            d["rounds"].as_u64().unwrap(),
            d["drafted"].as_u64().unwrap(),
            d["accepted"].as_u64().unwrap(),
        );
        assert!(rounds > 0 && drafted_n > 0 && kept <= drafted_n, "{d}");
    }
}

#[test]
fn prompt_lookup_prints_the_same_tokens_and_its_drafts() {
    let plain = generate(&[]);
    let looked_up = generate(&["--prompt-lookup", "2", "--draft-tokens", "4"]);
    assert_eq!(looked_up["tokens"], plain["tokens"]);
    assert!(
        looked_up["draft"]["rounds"].as_u64().is_some(),
        "{looked_up}"
    );

    let err = refused("gemma4-tiny", &["--prompt-lookup", "3"]);
    assert!(err.contains("--prompt-lookup"), "{err}");
}

/// `strata generate` on `model` with the tiny assistant as its draft model and `extra`,
/// which must fail: its error output.
fn refused(model: &str, extra: &[&str]) -> String {
    let assistant = tiny("gemma4-tiny-assistant");
    let mut args = vec!["--draft", &assistant];
    args.extend_from_slice(extra);
    let out = generate_with(model, "1,2,3", 4, &args);
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_draft_model_that_does_not_fit_is_refused_naming_the_field() {
    let err = refused("llama-tiny", &[]);
    assert!(err.contains("model_type") && err.contains("draft"), "{err}");
}

/// `--quantize`: a dense checkpoint quantized at load generates (its accuracy against
/// transformers is `strata-model`'s `weights_quantized_at_load_stay_close_to_transformers`);
/// a format weights are not quantized to at load is refused, naming the choices.
#[test]
fn quantize_at_load_generates_and_other_formats_are_refused() {
    let v = json_of(&generate_with(
        "llama-tiny",
        "5,9,300,17",
        6,
        &["--quantize", "q8_0"],
    ));
    assert_eq!(v["tokens"].as_array().map(Vec::len), Some(6), "{v}");
    // The CPU computes on blocks whatever `--gguf-weights` says: the same tokens.
    let blocks = ["--quantize", "q8_0", "--gguf-weights", "blocks"];
    let w = json_of(&generate_with("llama-tiny", "5,9,300,17", 6, &blocks));
    assert_eq!(w["tokens"], v["tokens"]);
    let out = generate_with("llama-tiny", "5,9", 2, &["--quantize", "q3_k"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("q8_0, q6_k, q4_k"), "{err}");
}

/// A Gemma-4 GGUF of llama.cpp's converter with its `gemma4-assistant` GGUF as the draft
/// model (tests/fixtures/gguf-gemma4): a text prompt through the file's own tokenizer, the
/// same output as without drafts, greedy and drawn with a seed, and the rounds reported.
#[test]
fn a_gemma4_gguf_drafts_with_its_assistant_gguf() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf-gemma4");
    let (model, assistant) = (
        dir.join("gemma4-tiny-Q8_0.gguf").display().to_string(),
        dir.join("gemma4-tiny-assistant-BF16.gguf")
            .display()
            .to_string(),
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--device",
            "cpu",
            "--prompt",
            "Strata serves Gemma-4 models over an",
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&strata(&args))
    };
    for sampling in [&[][..], &["--temperature", "0.8", "--seed", "7"][..]] {
        let plain = run(sampling);
        assert_eq!(plain["tokens"].as_array().unwrap().len(), 24);
        let mut with = vec!["--draft", assistant.as_str(), "--draft-tokens", "3"];
        with.extend_from_slice(sampling);
        let drafted = run(&with);
        assert_eq!(drafted["tokens"], plain["tokens"], "{sampling:?}");
        assert_eq!(drafted["text"], plain["text"], "{sampling:?}");
        let d = &drafted["draft"];
        assert!(d["rounds"].as_u64().unwrap() > 0, "{d}");
        assert!(d["drafted"].as_u64().unwrap() > 0, "{d}");
    }
}
