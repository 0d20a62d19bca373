//! Tool calling on chat: the `tools`, `tool_choice` and `parallel_tool_calls` fields, the
//! tool turns of a conversation, and the calls found in the output (`message.tool_calls`).
//!
//! The template receives the tools as transformers passes them (`tools`); a template that
//! cannot show them is refused unless `--tool-call-parser` names a format, whose
//! instructions then go into the system turn. `required` and a named function constrain the
//! output with a grammar built from the tools' schemas, in the format's own wrapping.

mod format;
mod gemma4;
mod gemma4_grammar;
mod hermes;
mod llama3;

use serde_json::{json, Value};
use strata_structured::Spec;
use strata_tokenizer::{ChatMessage, ChatOptions};

pub use format::{hold_at_marker, named, ParsedCall, TokenId, ToolFormat};

use super::api::ChatRequest;
use super::error::ApiError;
use super::routes::AppState;

/// Tools one request may offer.
pub const MAX_TOOLS: usize = 128;
/// Bytes of the tools' JSON in one request: each schema is compiled into a grammar.
pub const MAX_TOOLS_BYTES: usize = 256 * 1024;
/// Calls one history turn may carry.
pub const MAX_HISTORY_CALLS: usize = 128;

/// One function the model may call.
#[derive(Clone, Debug)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
}

/// What `tool_choice` allows.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// No call: the output is text.
    None,
    /// The model decides; calls in its output are parsed.
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// A call to this function, forced by a grammar.
    Named(String),
}

/// A request's tools, checked.
pub struct ToolPlan {
    /// The tools' JSON as the template receives it.
    pub tools_json: Vec<Value>,
    /// The tools.
    pub tools: Vec<Tool>,
    /// What `tool_choice` allows.
    pub choice: Choice,
    /// Several calls in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// The format the model's output is read in.
    pub format: &'static dyn ToolFormat,
    /// Whether the template cannot show tools: Strata writes them into the system turn.
    pub written_by_strata: bool,
}

/// How a chat request's output is read: the format and the prefix of call ids.
#[derive(Clone)]
pub struct ToolOutput {
    /// The format calls are parsed in.
    pub format: &'static dyn ToolFormat,
}

fn bad(field: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(field, msg.into())
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`, and picks the format from the
/// template (or `--tool-call-parser`, `parser`). `None` when the request offers no tools.
pub fn plan(
    req: &ChatRequest,
    template: Option<&strata_tokenizer::ChatTemplate>,
    parser: Option<&'static dyn ToolFormat>,
) -> Result<Option<ToolPlan>, ApiError> {
    plan_of(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.common.parallel_tool_calls,
        template,
        parser,
    )
}

/// [`plan`] from the fields themselves (`/tokenize` takes `tools` too).
pub fn plan_of(
    tools_field: Option<&Value>,
    choice_field: Option<&Value>,
    parallel: Option<bool>,
    template: Option<&strata_tokenizer::ChatTemplate>,
    parser: Option<&'static dyn ToolFormat>,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = parse_tools(tools_field)?;
    let choice = parse_choice(choice_field, &tools)?;
    if tools.is_empty() {
        return Ok(None);
    }
    let takes_tools = template.is_some_and(|t| t.takes_tools());
    if choice == Choice::None && !takes_tools && parser.is_none() {
        // Nothing would show the tools and no call is asked for: plain text, as without.
        return Ok(None);
    }
    let format = match (parser, template) {
        (Some(p), _) => p,
        (None, Some(t)) if takes_tools => format::detect(t.source()).ok_or_else(|| {
            bad(
                "tools",
                "this model's chat template shows tools in a format Strata cannot read: start the server with --tool-call-parser (hermes, llama3_json, gemma4)",
            )
        })?,
        _ => {
            return Err(bad(
                "tools",
                "this model's chat template cannot show tools: start the server with --tool-call-parser (hermes, llama3_json, gemma4) to have Strata describe them",
            ))
        }
    };
    let tools_json = tools_field
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(Some(ToolPlan {
        tools_json,
        tools,
        choice,
        parallel: parallel.unwrap_or(true),
        format,
        written_by_strata: !takes_tools,
    }))
}

fn parse_tools(v: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(bad(
                "tools",
                "tools must be a list of {\"type\": \"function\", \"function\": {...}}",
            ))
        }
    };
    if list.len() > MAX_TOOLS {
        return Err(bad(
            "tools",
            format!("{} tools; at most {MAX_TOOLS}", list.len()),
        ));
    }
    let bytes = Value::Array(list.clone()).to_string().len();
    if bytes > MAX_TOOLS_BYTES {
        return Err(bad(
            "tools",
            format!("the tools take {bytes} bytes; at most {MAX_TOOLS_BYTES}"),
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(
                "tools",
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("tools", format!("tools[{i}].function must be an object")))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let valid_name = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !valid_name {
            return Err(bad(
                "tools",
                format!(
                    "tools[{i}].function.name must be 1 to 64 letters, digits, '_', '-' or '.'"
                ),
            ));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(bad("tools", format!("two tools are named {name:?}")));
        }
        if f.get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(bad(
                "tools",
                format!("tools[{i}].function.description must be a string"),
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(bad(
                    "tools",
                    format!("tools[{i}].function.parameters must be a JSON Schema object"),
                ))
            }
        };
        tools.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    Ok(tools)
}

fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() { Choice::None } else { Choice::Auto })
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice {other:?} is not none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(obj) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| bad("tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            Choice::Named(name.to_string())
        }
    };
    match &choice {
        Choice::Required | Choice::Named(_) if tools.is_empty() => Err(bad(
            "tool_choice",
            "tool_choice asks for a call but the request offers no tools",
        )),
        Choice::Named(n) if !tools.iter().any(|t| &t.name == n) => Err(bad(
            "tool_choice",
            format!("tool_choice names {n:?}, which is not among the tools"),
        )),
        _ => Ok(choice),
    }
}

/// An assistant turn's `tool_calls` in Hugging Face's chat format: the arguments, sent as
/// JSON text by OpenAI clients, parsed into the object templates print.
pub fn history_calls(calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    if calls.len() > MAX_HISTORY_CALLS {
        return Err(bad(
            "messages",
            format!("at most {MAX_HISTORY_CALLS} tool_calls in one message"),
        ));
    }
    calls
        .iter()
        .map(|c| {
            let f = c
                .get("function")
                .ok_or_else(|| bad("messages", "each tool_calls entry needs a function"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("messages", "each tool call needs function.name"))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    bad(
                        "messages",
                        format!("the arguments of tool call {name:?} are not JSON: {e}"),
                    )
                })?,
                Some(a) => a.clone(),
            };
            let mut out =
                json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = c.get("id") {
                out["id"] = id.clone();
            }
            Ok(out)
        })
        .collect()
}

/// The template's view of the request: the tools for the template, or, for one that cannot
/// show them, the format's instructions in the system turn and the calls and answers of the
/// history written out as text.
pub fn render_input(
    plan: &ToolPlan,
    messages: Vec<ChatMessage>,
) -> (Vec<ChatMessage>, ChatOptions) {
    if !plan.written_by_strata {
        let options = ChatOptions {
            tools: Some(plan.tools_json.clone()),
            ..ChatOptions::default()
        };
        return (messages, options);
    }
    let mut listed = String::new();
    for t in &plan.tools_json {
        listed += "\n";
        listed += &t.to_string();
    }
    let intro = format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>{listed}\n</tools>\n\n{}",
        plan.format.example()
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages.into_iter().peekable();
    match rest.peek() {
        Some(m) if m.role == "system" => {
            let mut sys = rest.next().unwrap_or_default();
            sys.content = format!("{}\n\n{intro}", sys.content);
            out.push(sys);
        }
        _ => out.push(ChatMessage::text("system", &intro)),
    }
    for m in rest {
        let m = match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                let mut text = m.content.clone();
                for c in calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    let f = &c["function"];
                    text += &plan
                        .format
                        .write_call(f["name"].as_str().unwrap_or_default(), &f["arguments"]);
                }
                ChatMessage::text("assistant", &text)
            }
            ("tool", _) => ChatMessage::text(
                "user",
                &format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
            _ => m,
        };
        out.push(m);
    }
    (out, ChatOptions::default())
}

/// The grammar `tool_choice` asks for (`required` or a named function); `None` for `auto`
/// and `none`.
pub fn forced(plan: &ToolPlan, token_id: &TokenId) -> Result<Option<Spec>, ApiError> {
    let tools: Vec<Tool> = match &plan.choice {
        Choice::None | Choice::Auto => return Ok(None),
        Choice::Required => plan.tools.clone(),
        Choice::Named(n) => plan
            .tools
            .iter()
            .filter(|t| &t.name == n)
            .cloned()
            .collect(),
    };
    let parallel = plan.parallel && plan.choice == Choice::Required;
    let grammar = plan.format.grammar(&tools, parallel, token_id);
    grammar.map(Spec::Lark).map(Some).ok_or_else(|| {
        bad(
            "tool_choice",
            format!("tool_choice \"required\" or a named function cannot be forced here for the {} format: its markers are not control tokens of this vocabulary, or a tool's parameters use a schema keyword its arguments cannot be forced to (use auto)", plan.format.name()),
        )
    })
}

/// Each tool's parameters, compiled as a JSON Schema: one that does not compile is a 400
/// naming the tool, before anything reaches the engine.
pub async fn check_schemas(st: &AppState, tools: &[Tool]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let spec = Spec::JsonSchema(t.parameters.clone());
        super::structured::compile(st, "tools", spec)
            .await
            .map_err(|e| {
                bad(
                    "tools",
                    format!("tools[{i}].function.parameters ({}): {}", t.name, e.message),
                )
            })?;
    }
    Ok(())
}

/// The calls as `message.tool_calls` (arguments as their JSON text), ids `{id}_{i}`.
pub fn calls_json(calls: &[ParsedCall], id: &str) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "id": format!("call_{id}_{i}"),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()},
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(names: &[&str]) -> Vec<Tool> {
        names
            .iter()
            .map(|n| Tool {
                name: n.to_string(),
                parameters: json!({}),
            })
            .collect()
    }

    #[test]
    fn tool_choice_forms() {
        let t = tools(&["a", "b"]);
        assert_eq!(parse_choice(None, &t).unwrap(), Choice::Auto);
        assert_eq!(parse_choice(None, &[]).unwrap(), Choice::None);
        assert_eq!(
            parse_choice(Some(&json!("required")), &t).unwrap(),
            Choice::Required
        );
        let named = json!({"type": "function", "function": {"name": "b"}});
        assert_eq!(
            parse_choice(Some(&named), &t).unwrap(),
            Choice::Named("b".into())
        );
        let unknown = json!({"type": "function", "function": {"name": "c"}});
        assert!(parse_choice(Some(&unknown), &t)
            .unwrap_err()
            .message
            .contains("\"c\""));
        assert!(parse_choice(Some(&json!("required")), &[]).is_err());
        assert!(parse_choice(Some(&json!("sometimes")), &t).is_err());
    }

    #[test]
    fn tools_are_checked_and_bounded() {
        let one = |f: Value| json!([{"type": "function", "function": f}]);
        assert_eq!(
            parse_tools(Some(&one(json!({"name": "f"})))).unwrap()[0].parameters["type"],
            "object"
        );
        assert!(parse_tools(Some(&one(json!({"name": "bad name"})))).is_err());
        assert!(parse_tools(Some(&one(json!({"name": "f", "parameters": 3})))).is_err());
        assert!(parse_tools(Some(&json!([{"type": "retrieval"}]))).is_err());
        let many: Vec<Value> = (0..=MAX_TOOLS)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        assert!(parse_tools(Some(&Value::Array(many))).is_err());
    }

    #[test]
    fn templates_without_tools_refuse_them_unless_told_a_format() {
        let t =
            strata_tokenizer::ChatTemplate::new(strata_tokenizer::GEMMA_TEMPLATE, "", "").unwrap();
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let err = plan_of(Some(&tools), None, None, Some(&t), None)
            .err()
            .unwrap();
        assert_eq!(err.param.as_deref(), Some("tools"));
        // tool_choice "none" asks for text: the tools are left out.
        assert!(
            plan_of(Some(&tools), Some(&json!("none")), None, Some(&t), None)
                .unwrap()
                .is_none()
        );
        let told = plan_of(Some(&tools), None, None, Some(&t), named("hermes"))
            .unwrap()
            .unwrap();
        assert!(told.written_by_strata && told.choice == Choice::Auto);
    }

    #[test]
    fn history_arguments_become_objects() {
        let calls = [
            json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}),
        ];
        let out = history_calls(&calls).unwrap();
        assert_eq!(out[0]["function"]["arguments"], json!({"x": 1}));
        let bad = [json!({"function": {"name": "f", "arguments": "{x"}})];
        assert!(history_calls(&bad).is_err());
    }
}

#[cfg(test)]
mod reference {
    use super::*;

    /// Each fixture template is told as its family's format.
    #[test]
    fn formats_are_told_from_templates() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/templates/"
        );
        for (file, format) in [
            ("qwen3.jinja", "hermes"),
            ("llama3.jinja", "llama3_json"),
            ("gemma4.jinja", "gemma4"),
        ] {
            let source = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
            assert_eq!(
                format::detect(&source).map(|f| f.name()),
                Some(format),
                "{file}"
            );
        }
        assert!(format::detect(strata_tokenizer::GEMMA_TEMPLATE).is_none());
    }

    /// Each family's parser reads back the call its model's own template writes, as
    /// transformers rendered it (tests/fixtures/templates/tools-reference.json).
    #[test]
    fn parsers_read_the_calls_their_templates_write() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/templates/tools-reference.json"
        );
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let call = &reference["conversations"]["tool_turns"][1]["tool_calls"][0]["function"];
        let turns = [
            (
                "qwen3.jinja",
                "<|im_start|>assistant\n",
                "<|im_end|>",
                "hermes",
            ),
            (
                "llama3.jinja",
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
                "<|eot_id|>",
                "llama3_json",
            ),
            ("gemma4.jinja", "<|turn>model\n", "<turn|>", "gemma4"),
            (
                "hermes.jinja",
                "<|im_start|>assistant\n",
                "<|im_end|>",
                "hermes",
            ),
        ];
        for (template, open, close, format) in turns {
            let case = reference["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| {
                    c["template"] == template
                        && c["conversation"] == "tool_turns"
                        && c["tools"] == true
                })
                .unwrap();
            let text = case["text"].as_str().unwrap();
            let turn = text
                .split(open)
                .nth(1)
                .unwrap()
                .split(close)
                .next()
                .unwrap();
            let (before, calls) = named(format)
                .unwrap()
                .parse(turn)
                .unwrap_or_else(|| panic!("{template}: {turn}"));
            assert_eq!(before, "", "{template}");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, call["name"].as_str().unwrap(), "{template}");
            assert_eq!(calls[0].arguments, call["arguments"], "{template}");
        }
    }
}
