//! One tool-call format per model family, behind one trait: how calls look in the model's
//! output, how to find them, and the grammar that forces them.

use serde_json::Value;

use super::Tool;

/// One call found in the output: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as parsed (sent to the client as their JSON text).
    pub arguments: Value,
}

/// A model family's way of writing tool calls.
pub trait ToolFormat: Send + Sync {
    /// The name `--tool-call-parser` takes.
    fn name(&self) -> &'static str;

    /// Whether a chat template speaks this format (read from its source).
    fn detects(&self, template: &str) -> bool;

    /// The output split into the text before the calls and the calls; `None` when the
    /// output holds no call that parses (it is then plain content).
    fn parse(&self, text: &str) -> Option<(String, Vec<ParsedCall>)>;

    /// Bytes at the start of `text` that cannot belong to a call: a stream sends them as
    /// content and holds the rest until it knows.
    fn plain_prefix(&self, text: &str) -> usize;

    /// A Lark grammar (llguidance's) whose every output is one call (several with
    /// `parallel`) to one of `tools`, its arguments under the tool's schema; `None` where
    /// the format cannot be forced this way (or `token_id`, the vocabulary's id of a
    /// control token's text, lacks one of its markers).
    fn grammar(&self, tools: &[Tool], parallel: bool, token_id: &TokenId) -> Option<String>;

    /// Texts of the format's markers that are control tokens in its models' vocabularies:
    /// the output must keep their text for the calls to be found.
    fn control_markers(&self) -> &'static [&'static str] {
        &[]
    }

    /// How a call is written, for the instructions of a template that cannot show tools.
    fn example(&self) -> &'static str;

    /// One call as the model writes it (an assistant turn of the history, for a template
    /// that cannot show tool calls).
    fn write_call(&self, name: &str, arguments: &Value) -> String;
}

/// A vocabulary's id of a control token's text.
pub type TokenId<'a> = dyn Fn(&str) -> Option<u32> + 'a;

/// The formats Strata knows.
pub fn all() -> [&'static dyn ToolFormat; 3] {
    [
        &super::hermes::Hermes,
        &super::llama3::Llama3,
        &super::gemma4::Gemma4,
    ]
}

/// The format named `name` (`--tool-call-parser`).
pub fn named(name: &str) -> Option<&'static dyn ToolFormat> {
    all().into_iter().find(|f| f.name() == name)
}

/// The format a template speaks, if Strata knows it.
pub fn detect(template: &str) -> Option<&'static dyn ToolFormat> {
    all().into_iter().find(|f| f.detects(template))
}

/// Where a stream must start holding `text` back: at `marker`, or at a tail that may be
/// the start of it.
pub fn hold_at_marker(text: &str, marker: &str) -> usize {
    if let Some(at) = text.find(marker) {
        return at;
    }
    // The marker is ASCII, so a matching tail starts on a character boundary.
    (1..marker.len())
        .rev()
        .find(|&k| text.as_bytes().ends_with(&marker.as_bytes()[..k]))
        .map_or(text.len(), |k| text.len() - k)
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`), as chat templates print
/// calls and as the forcing grammars spell them.
pub fn python_json(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.clone()), python_json(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// A Lark string literal of `text` (Lark takes JSON's escapes).
pub fn lark_literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// A tool's arguments as inline JSON in a Lark grammar: under its schema, written compactly
/// (`{"a": 1}`) as the formats print them.
pub fn lark_json(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
        });
    }
    format!("%json {schema}")
}

/// Calls a forced answer may hold with `parallel_tool_calls`.
pub const MAX_PARALLEL_CALLS: usize = 8;

/// `start` over per-tool alternatives `call_i`, each built by `call(i, tool)`; with
/// `parallel`, one or more calls joined by `sep`.
pub fn alternatives(
    tools: &[Tool],
    parallel: bool,
    sep: &str,
    call: impl Fn(usize, &Tool) -> String,
) -> String {
    alternatives_with(tools, parallel, sep, call, |t| {
        Some(lark_json(&t.parameters))
    })
    .expect("JSON arguments always lower")
}

/// As [`alternatives`], each tool's `args_i` rule body from `args` (`None` when one
/// cannot be written); calls joined by `sep` (nothing between them when empty).
pub fn alternatives_with(
    tools: &[Tool],
    parallel: bool,
    sep: &str,
    call: impl Fn(usize, &Tool) -> String,
    mut args: impl FnMut(&Tool) -> Option<String>,
) -> Option<String> {
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    let mut g = String::from("start: calls\n");
    g += &format!("one: {}\n", names.join(" | "));
    // 1 to MAX_PARALLEL_CALLS calls, spelled out: a model that keeps calling stops there.
    let most = if parallel { MAX_PARALLEL_CALLS } else { 1 };
    let join = match sep.is_empty() {
        true => " ".to_string(),
        false => format!(" {} ", lark_literal(sep)),
    };
    let counts: Vec<String> = (1..=most).map(|n| vec!["one"; n].join(&join)).collect();
    g += &format!("calls: {}\n", counts.join(" | "));
    for (i, t) in tools.iter().enumerate() {
        g += &format!("call_{i}: {}\n", call(i, t));
        g += &format!("args_{i}: {}\n", args(t)?);
    }
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use strata_structured::{Grammars, Spec, Vocab};

    /// Grammars over a byte vocabulary: ids 0..256 are the bytes, 256 the end.
    fn byte_grammars() -> Grammars {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"</s>".to_vec());
        let special = [vec![false; 256], vec![true]].concat();
        Grammars::new(Vocab::new(words, special, 256), |t: &[u8]| {
            t.iter().map(|&b| u32::from(b)).collect()
        })
        .unwrap()
    }

    /// Whether `lark` takes `text` whole and may end after it.
    fn accepts(g: &Grammars, lark: &str, text: &str) -> bool {
        let mut c = g.constraint(&Spec::Lark(lark.into())).unwrap();
        for &b in text.as_bytes() {
            let mut logits = vec![0.0f32; 257];
            if c.0.mask(&mut logits).is_err() || logits[b as usize] == f32::NEG_INFINITY {
                return false;
            }
            c.0.commit(u32::from(b)).unwrap();
        }
        let mut logits = vec![0.0f32; 257];
        c.0.mask(&mut logits).is_ok() && logits[256] == 0.0
    }

    #[test]
    fn forcing_grammars_take_what_the_formats_parse() {
        let g = byte_grammars();
        let add = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                         "additionalProperties": false});
        let tools = [
            Tool {
                name: "add".into(),
                parameters: add,
            },
            Tool {
                name: "now".into(),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ];
        let args = json!({"a": 1});
        for format in all() {
            let Some(lark) = format.grammar(&tools, false, &|_: &str| None) else {
                continue;
            };
            let one = format.write_call("add", &args);
            assert!(accepts(&g, &lark, &one), "{}: {one}", format.name());
            assert_eq!(format.parse(&one).unwrap().1[0].arguments, args);
            // Arguments outside the schema, or an unknown tool, are not taken.
            assert!(!accepts(
                &g,
                &lark,
                &format.write_call("add", &json!({"a": "x"}))
            ));
            assert!(!accepts(&g, &lark, &format.write_call("sub", &args)));
        }
        // Parallel calls, at most MAX_PARALLEL_CALLS of them.
        let lark = super::super::hermes::Hermes
            .grammar(&tools, true, &|_: &str| None)
            .unwrap();
        let call = super::super::hermes::Hermes.write_call("add", &args);
        let calls = |n: usize| vec![call.as_str(); n].join("\n");
        assert!(accepts(&g, &lark, &calls(2)));
        assert!(accepts(&g, &lark, &calls(MAX_PARALLEL_CALLS)));
        assert!(!accepts(&g, &lark, &calls(MAX_PARALLEL_CALLS + 1)));
    }

    #[test]
    fn holds_from_a_partial_marker() {
        assert_eq!(hold_at_marker("hello <tool", "<tool_call>"), 6);
        assert_eq!(hold_at_marker("hello <tool_call>{", "<tool_call>"), 6);
        assert_eq!(hold_at_marker("hello", "<tool_call>"), 5);
        assert_eq!(hold_at_marker("a <", "<tool_call>"), 2);
        assert_eq!(hold_at_marker("", "<tool_call>"), 0);
    }
}
