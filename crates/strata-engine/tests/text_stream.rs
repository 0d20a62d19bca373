//! Streaming text with stop strings, on a small vocabulary built in the test.

use std::sync::Arc;

use strata_engine::TextStream;
use strata_gguf::{writer::GgufWriter, GgufFile, Value};
use strata_tokenizer::Tokenizer;

const TOKENS: &[&str] = &[
    "<unk>",
    "<s>",
    "</s>",
    "\u{2581}Hello",
    "\u{2581}wor",
    "ld",
    "S",
    "T",
    "O",
    "P",
    "!",
    "<0xC3>",
    "<0xA9>",
];

fn tokenizer() -> Arc<Tokenizer> {
    let mut w = GgufWriter::new();
    w.str("tokenizer.ggml.model", "llama")
        .array(
            "tokenizer.ggml.tokens",
            TOKENS
                .iter()
                .map(|t| Value::String(t.to_string()))
                .collect(),
        )
        .array(
            "tokenizer.ggml.token_type",
            TOKENS
                .iter()
                .map(|t| {
                    Value::I32(if t.starts_with("<0x") {
                        6
                    } else if t.starts_with('<') {
                        3
                    } else {
                        1
                    })
                })
                .collect(),
        );
    Arc::new(Tokenizer::from_gguf(&GgufFile::from_vec(w.to_bytes()).unwrap()).unwrap())
}

fn id(text: &str) -> u32 {
    TOKENS.iter().position(|t| *t == text).unwrap() as u32
}

#[test]
fn stop_string_cuts_the_text_and_nothing_after_it_is_emitted() {
    let mut s = TextStream::new(tokenizer(), vec!["STOP".into()]);
    let mut out = String::new();
    for t in ["\u{2581}Hello", "\u{2581}wor", "ld"] {
        out.push_str(&s.push(id(t)));
    }
    assert_eq!(out, " Hello world");
    // A possible stop string is held back...
    assert_eq!(s.push(id("S")), "");
    assert_eq!(s.push(id("T")), "");
    assert_eq!(s.push(id("O")), "");
    assert!(!s.stopped());
    // ...and dropped once it completes.
    assert_eq!(s.push(id("P")), "");
    assert!(s.stopped());
    assert_eq!(s.push(id("!")), "");
    assert_eq!(s.finish(), "");
}

#[test]
fn held_back_text_is_released_when_it_is_not_a_stop_string() {
    let mut s = TextStream::new(tokenizer(), vec!["STOP".into()]);
    assert_eq!(s.push(id("S")), "");
    assert_eq!(s.push(id("T")), "");
    assert_eq!(s.push(id("!")), "ST!");
    assert_eq!(s.push(id("S")), "");
    assert_eq!(s.finish(), "S");
}

#[test]
fn split_utf8_characters_wait_for_their_last_byte() {
    let mut s = TextStream::new(tokenizer(), vec![]);
    assert_eq!(s.push(id("<0xC3>")), "");
    assert_eq!(s.push(id("<0xA9>")), "\u{e9}");
    assert_eq!(s.push(id("<0xC3>")), "");
    assert_eq!(s.finish(), "\u{fffd}");
}

#[test]
fn listed_control_tokens_keep_their_text() {
    // `</s>` is a control token: left out of text unless the request lists it (a tool-call
    // format's markers are, for Gemma-4).
    let ids = [id("\u{2581}Hello"), id("</s>"), id("!")];
    let mut plain = TextStream::new(tokenizer(), vec![]);
    let text: String = ids.iter().map(|&t| plain.push(t)).collect::<String>() + &plain.finish();
    assert_eq!(text, " Hello!");
    let mut shown = TextStream::new(tokenizer(), vec![]).showing_controls(vec![id("</s>")]);
    let text: String = ids.iter().map(|&t| shown.push(t)).collect::<String>() + &shown.finish();
    assert_eq!(text, " Hello</s>!");
}
