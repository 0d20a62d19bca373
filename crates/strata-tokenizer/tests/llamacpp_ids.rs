//! Token ids equal llama.cpp's on a committed corpus (tests/fixtures/tokenizer/*.json, made
//! with the llama.cpp build described in tests/fixtures/llamacpp/README.md). Needs the real
//! GGUF files in models/ (scripts/fetch-models.sh); without them the test says so and passes.

use std::path::{Path, PathBuf};

use serde_json::Value;
use strata_gguf::GgufFile;
use strata_tokenizer::{StreamDecoder, Tokenizer};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where a fixture's GGUF is: `model_path` (relative to the repository, or under
/// `$STRATA_GEMMA4_GGUF` for the GGUFs `scripts/reference/make_gemma4_gguf_fixtures.py`
/// rebuilds rather than commits), else `models/<model_file>`; `None` when it is absent.
fn model_path(fx: &Value) -> Option<PathBuf> {
    let path = match fx.get("model_path").and_then(Value::as_str) {
        Some(p) => match p.strip_prefix("$STRATA_GEMMA4_GGUF/") {
            Some(name) => PathBuf::from(std::env::var_os("STRATA_GEMMA4_GGUF")?).join(name),
            None => repo().join(p),
        },
        None => repo()
            .join("models")
            .join(fx["model_file"].as_str().unwrap()),
    };
    path.exists().then_some(path)
}

fn how_to_get(fx: &Value) -> &'static str {
    match fx.get("model_path").and_then(Value::as_str) {
        Some(p) if p.starts_with('$') => {
            "set STRATA_GEMMA4_GGUF to scripts/reference/make_gemma4_gguf_fixtures.py's --work"
        }
        _ => "run scripts/fetch-models.sh",
    }
}

fn check(fixture: &str) {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/fixtures/tokenizer").join(fixture)).unwrap(),
    )
    .unwrap();
    let Some(model) = model_path(&fx) else {
        eprintln!(
            "skipping {fixture}: its GGUF is absent ({})",
            how_to_get(&fx)
        );
        return;
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    assert_eq!(tok.adds_bos(), fx["add_bos"].as_bool().unwrap());
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut failures = Vec::new();
    let cases = fx["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        for (key, parse_special) in [("ids", false), ("ids_parse_special", true)] {
            let Some(expected) = case.get(key) else {
                continue;
            };
            let got = tok.encode(text, true, parse_special).unwrap();
            if got != ids(expected) {
                failures.push(format!(
                    "{key} {text:?}:\n  llama.cpp {:?}\n  strata    {got:?}",
                    ids(expected)
                ));
            }
        }
        // Streaming decode of the ids gives back the text (BOS dropped, no special tokens).
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        for &id in &tok.encode(text, false, false).unwrap() {
            out.push_str(&dec.push(&tok, id).unwrap());
        }
        out.push_str(&dec.finish());
        if out != text {
            failures.push(format!("round trip {text:?} -> {out:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{fixture}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    check("gemma-3-270m.json");
}

#[test]
fn smollm2_matches_llama_cpp() {
    check("smollm2-135m-instruct.json");
}

/// Gemma-4 GGUFs as llama.cpp's converter writes them (`tokenizer.ggml.model = "gemma4"`:
/// merges over U+2581 text with byte fallback); the tiny ones are committed, the mid-size
/// ones rebuilt by scripts/reference/make_gemma4_gguf_fixtures.py.
#[test]
fn gemma4_ggufs_match_llama_cpp() {
    for name in ["tiny", "mid"] {
        for q in ["bf16", "q8-0", "q6-k", "q4-k-m"] {
            let fixture = format!("gemma4-{name}-{q}.json");
            if repo()
                .join("tests/fixtures/tokenizer")
                .join(&fixture)
                .exists()
            {
                check(&fixture);
            }
        }
    }
}
