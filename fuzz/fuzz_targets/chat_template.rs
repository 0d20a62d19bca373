//! The chat template renderer on hostile input: any template source (a model file carries
//! its own) with any conversation, and the real templates with any conversation. Rendering
//! returns text or an error; it never panics, and the fuel bound ends endless loops.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use strata_gguf::GgufFile;
use strata_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, GEMMA_TEMPLATE};

/// SmolLM2's template (ChatML), as its GGUF carries it.
fn chatml() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let dir = std::env::var("STRATA_FUZZ_MODELS").unwrap_or_else(|_| "../models".into());
        let path = std::path::Path::new(&dir).join("SmolLM2-135M-Instruct.Q4_1.gguf");
        let file = GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-models.sh)", path.display()));
        let tok = Tokenizer::from_gguf(&file).expect("the vocabulary loads");
        tok.chat_template()
            .expect("SmolLM2 has a template")
            .to_string()
    })
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// 0: the input's own template; 1: Gemma's; 2: SmolLM2's.
    which: u8,
    template: String,
    messages: Vec<(u8, String)>,
    add_generation_prompt: bool,
}

fuzz_target!(|input: Input| {
    let source = match input.which % 3 {
        0 => input.template.as_str(),
        1 => GEMMA_TEMPLATE,
        _ => chatml(),
    };
    let Ok(template) = ChatTemplate::new(source, "<bos>", "<eos>") else {
        return;
    };
    let roles = ["system", "user", "assistant", "tool"];
    let messages: Vec<ChatMessage> = input
        .messages
        .into_iter()
        .take(64)
        .map(|(r, content)| ChatMessage {
            role: roles[r as usize % roles.len()].to_string(),
            content,
            ..ChatMessage::default()
        })
        .collect();
    if let Ok(text) = template.render(&messages, input.add_generation_prompt) {
        // The real templates print every message's content.
        if input.which % 3 == 2 {
            assert!(messages.iter().all(|m| text.contains(&m.content)));
        }
    }
});
