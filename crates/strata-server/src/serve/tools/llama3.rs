//! Llama 3.1 to 3.3: the answer is the call, one JSON object `{"name": ...,
//! "parameters": {...}}` (after `<|python_tag|>` at times; Llama 3.2 may write several,
//! separated by `;`).

use serde_json::Value;

use super::format::{alternatives, lark_literal, python_json, ParsedCall, TokenId, ToolFormat};
use super::hermes::call_of;
use super::Tool;

const PYTHON_TAG: &str = "<|python_tag|>";

/// The Llama-3 JSON format.
pub struct Llama3;

impl ToolFormat for Llama3 {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn detects(&self, template: &str) -> bool {
        template.contains("<|start_header_id|>") && template.contains("\"parameters\": ")
    }

    fn parse(&self, text: &str) -> Option<(String, Vec<ParsedCall>)> {
        let body = text.trim_start();
        let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
        if !body.starts_with('{') {
            return None;
        }
        let mut calls = Vec::new();
        for part in body.split(';') {
            let v: Value = serde_json::from_str(part.trim()).ok()?;
            // A JSON answer that is not a call stays content.
            v.get("parameters").or_else(|| v.get("arguments"))?;
            calls.push(call_of(v)?);
        }
        Some((String::new(), calls))
    }

    fn plain_prefix(&self, text: &str) -> usize {
        let t = text.trim_start();
        // The call can only open the answer.
        if t.is_empty()
            || t.starts_with('{')
            || t.starts_with(PYTHON_TAG)
            || PYTHON_TAG.starts_with(t)
        {
            0
        } else {
            text.len()
        }
    }

    fn grammar(&self, tools: &[Tool], parallel: bool, _: &TokenId) -> Option<String> {
        Some(alternatives(tools, parallel, "; ", |i, t| {
            let head = format!(
                "{{\"name\": {}, \"parameters\": ",
                Value::from(t.name.clone())
            );
            format!("{} args_{i} \"}}\"", lark_literal(&head))
        }))
    }

    fn example(&self) -> &'static str {
        "To call a function, respond with JSON for a function call in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables."
    }

    fn write_call(&self, name: &str, arguments: &Value) -> String {
        python_json(&serde_json::json!({"name": name, "parameters": arguments}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_one_or_several_calls() {
        let (text, calls) = Llama3
            .parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}")
            .unwrap();
        assert_eq!(text, "");
        assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
        let (_, calls) = Llama3
            .parse("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}")
            .unwrap();
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(Llama3
            .parse("Hello {\"name\": \"a\", \"parameters\": {}}")
            .is_none());
        assert!(Llama3.parse("{\"answer\": 4}").is_none());
        assert_eq!(Llama3.plain_prefix("  {\"na"), 0);
        assert_eq!(Llama3.plain_prefix("Hi"), 2);
    }
}
