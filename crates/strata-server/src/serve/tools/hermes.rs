//! Hermes and Qwen (Qwen2.5, Qwen3, SmolLM3, Hermes-2/3): each call is a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines.

use serde_json::Value;

use super::format::{
    alternatives, hold_at_marker, lark_literal, python_json, ParsedCall, TokenId, ToolFormat,
};
use super::Tool;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The `<tool_call>` format.
pub struct Hermes;

impl ToolFormat for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn detects(&self, template: &str) -> bool {
        template.contains(OPEN)
    }

    fn parse(&self, text: &str) -> Option<(String, Vec<ParsedCall>)> {
        let start = text.find(OPEN)?;
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(body) = rest.strip_prefix(OPEN) {
            // The last call may lack its closing tag (the model stopped right after it).
            let (inner, after) = body.split_once(CLOSE).unwrap_or((body, ""));
            calls.push(call_of(serde_json::from_str(inner.trim()).ok()?)?);
            rest = after.trim_start();
        }
        // Text after the calls: not a clean call answer, leave it all as content.
        if !rest.is_empty() {
            return None;
        }
        Some((text[..start].to_string(), calls))
    }

    fn plain_prefix(&self, text: &str) -> usize {
        hold_at_marker(text, OPEN)
    }

    fn grammar(&self, tools: &[Tool], parallel: bool, _: &TokenId) -> Option<String> {
        Some(alternatives(tools, parallel, "\n", |i, t| {
            let head = format!(
                "{OPEN}\n{{\"name\": {}, \"arguments\": ",
                Value::from(t.name.clone())
            );
            format!(
                "{} args_{i} {}",
                lark_literal(&head),
                lark_literal(&format!("}}\n{CLOSE}"))
            )
        }))
    }

    fn example(&self) -> &'static str {
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    }

    fn write_call(&self, name: &str, arguments: &Value) -> String {
        let call = python_json(&serde_json::json!({"name": name, "arguments": arguments}));
        format!("{OPEN}\n{call}\n{CLOSE}")
    }
}

/// `{"name", "arguments"}` (the arguments an object, or its JSON text) as a call.
pub(super) fn call_of(v: Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(a) => a.clone(),
    };
    arguments
        .is_object()
        .then_some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_calls_and_the_text_before() {
        let out = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (text, calls) = Hermes.parse(out).unwrap();
        assert_eq!(text, "Let me look.\n");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(calls[1].arguments, json!({}));
        // No call, a broken call, text after the call: plain content.
        assert!(Hermes.parse("just text").is_none());
        assert!(Hermes
            .parse("<tool_call>\n{\"name\": \"x\", \"arguments\": {\n</tool_call>")
            .is_none());
        assert!(Hermes
            .parse("<tool_call>{\"name\": \"x\"}</tool_call> and more")
            .is_none());
        // An unclosed last call still parses.
        assert!(Hermes
            .parse("<tool_call>{\"name\": \"x\", \"arguments\": {}}")
            .is_some());
    }

    #[test]
    fn writes_what_it_parses() {
        let text = Hermes.write_call("f", &json!({"a": [1, 2]}));
        let (_, calls) = Hermes.parse(&text).unwrap();
        assert_eq!(calls[0].arguments, json!({"a": [1, 2]}));
    }
}
