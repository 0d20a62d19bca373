//! `strata generate --draft` through the real binary: the tiny Gemma-4 target with its tiny
//! assistant (CPU), prompts given as token ids.

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

fn generate(extra: &[&str]) -> Value {
    let model = tiny("gemma4-tiny");
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--prompt-ids",
        "5,9,300,17,2,8,77",
        "--max-tokens",
        "20",
        "--ignore-eos",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = strata(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
    let model = tiny(model);
    let assistant = tiny("gemma4-tiny-assistant");
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--prompt-ids",
        "1,2,3",
        "--draft",
        &assistant,
    ];
    args.extend_from_slice(extra);
    let out = strata(&args);
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_draft_model_that_does_not_fit_is_refused_naming_the_field() {
    let err = refused("llama-tiny", &[]);
    assert!(err.contains("model_type") && err.contains("draft"), "{err}");
}
