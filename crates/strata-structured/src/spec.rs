//! What a request asks its output to be.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

/// A request's structured-output form (OpenAI's `response_format`, vLLM's `guided_*`).
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this schema (`json_schema`, `guided_json`).
    JsonSchema(Value),
    /// Text matching this regular expression, whole (`guided_regex`).
    Regex(String),
    /// Exactly one of these strings (`guided_choice`).
    Choice(Vec<String>),
    /// Text of this Lark grammar, llguidance's syntax (`guided_grammar`).
    Lark(String),
}

impl Spec {
    /// The llguidance grammar of this form.
    pub(crate) fn grammar(&self) -> TopLevelGrammar {
        match self {
            Spec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Choice(options) => {
                // Lark string literals take JSON's escapes.
                let alternatives: Vec<String> = options
                    .iter()
                    .map(|o| Value::String(o.clone()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }

    /// A key naming the grammar, for the cache of compiled ones.
    pub(crate) fn key(&self) -> String {
        match self {
            Spec::JsonObject => "object".into(),
            Spec::JsonSchema(s) => format!("schema:{s}"),
            Spec::Regex(r) => format!("regex:{r}"),
            Spec::Choice(o) => format!("choice:{}", Value::from(o.clone())),
            Spec::Lark(g) => format!("lark:{g}"),
        }
    }
}

/// JSON output is compact, `{"a": 1, "b": [2, 3]}`: whitespace elsewhere would let a model
/// spend its tokens on newlines and indentation (small models do, until `max_tokens`). A
/// schema's own `x-guidance` options (llguidance's) take precedence.
fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "item_separator": ", ",
                "key_separator": ": ",
                "whitespace_flexible": false,
            })
        });
    }
    schema
}
