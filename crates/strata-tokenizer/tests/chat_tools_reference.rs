//! Chat templates with tools and tool turns render to the same text as transformers'
//! renderer (`apply_chat_template(..., tools=...)`), for the Qwen3, Llama-3, Gemma-4 and
//! Hermes tool-use templates. The reference strings come from scripts/reference/chat_template_tools.py.

use std::path::Path;

use serde_json::Value;
use strata_tokenizer::{ChatMessage, ChatOptions, ChatTemplate};

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

#[test]
fn templates_render_tools_as_transformers_does() {
    let dir = fixtures();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tools-reference.json")).unwrap())
            .unwrap();
    let tools: Vec<Value> = reference["tools"].as_array().unwrap().clone();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 14);
    for case in cases {
        let source = std::fs::read_to_string(dir.join(case["template"].as_str().unwrap())).unwrap();
        let t = ChatTemplate::new(
            &source,
            case["bos_token"].as_str().unwrap(),
            case["eos_token"].as_str().unwrap(),
        )
        .unwrap();
        let name = case["conversation"].as_str().unwrap();
        let messages: Vec<ChatMessage> =
            serde_json::from_value(reference["conversations"][name].clone()).unwrap();
        let options = ChatOptions {
            tools: case["tools"].as_bool().unwrap().then(|| tools.clone()),
            ..ChatOptions::default()
        };
        let got = t.render_with(&messages, true, &options).unwrap();
        assert_eq!(
            got,
            case["text"].as_str().unwrap(),
            "{} / {name} / tools {}",
            case["template"],
            case["tools"]
        );
    }
}

#[test]
fn template_kwargs_reach_the_template() {
    // Qwen3's thinking switch, as `chat_template_kwargs` passes it.
    let source = std::fs::read_to_string(fixtures().join("qwen3.jinja")).unwrap();
    let t = ChatTemplate::new(&source, "", "<|im_end|>").unwrap();
    let mut options = ChatOptions::default();
    options
        .kwargs
        .insert("enable_thinking".into(), Value::Bool(false));
    let text = t
        .render_with(&[ChatMessage::text("user", "hi")], true, &options)
        .unwrap();
    assert!(
        text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{text}"
    );
}
