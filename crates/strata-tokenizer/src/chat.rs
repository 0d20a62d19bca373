//! Chat prompts from message lists, with the model's own Jinja template.

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TokenizerError;

/// One message of a conversation, as the chat template receives it (Hugging Face's chat
/// format: the optional fields are left out of the template's view when absent, since
/// templates test `'tool_calls' in message`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant`, `tool` (whatever roles the template knows).
    pub role: String,
    /// The message's text.
    pub content: String,
    /// An assistant turn's calls: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}` with the arguments as an object, as templates print them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool turn's answer to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The speaker's name (for a tool turn: the function's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A message with media: its parts in order, which the template receives as the
    /// content list (`{"type": "text", "text"}`, `{"type": "image"}`, `{"type": "audio"}`),
    /// so that it places each item's marker. `content` holds the text parts joined.
    #[serde(skip)]
    pub parts: Vec<ChatPart>,
}

/// One part of a message with media, as chat templates receive it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatPart {
    /// Text.
    Text(String),
    /// An image, where the template writes its marker.
    Image,
    /// An audio clip, likewise.
    Audio,
}

impl ChatPart {
    fn to_json(&self) -> Value {
        match self {
            Self::Text(t) => serde_json::json!({"type": "text", "text": t}),
            Self::Image => serde_json::json!({"type": "image"}),
            Self::Audio => serde_json::json!({"type": "audio"}),
        }
    }
}

impl ChatMessage {
    /// A plain text turn.
    pub fn text(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// What a template receives beside the messages.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// The functions the model may call, as the `tools` variable (`None` renders as none,
    /// as transformers passes it).
    pub tools: Option<Vec<Value>>,
    /// More variables (`chat_template_kwargs`, such as `enable_thinking`).
    pub kwargs: serde_json::Map<String, Value>,
}

/// Gemma's turn format, used for Gemma models whose files carry no template (the Gemma-3
/// 270M GGUF, for one). A system message is folded into the first user turn as Gemma's own
/// template does.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages and messages[0].role == 'system' -%}\
{%- set first_user_prefix = messages[0].content + '\\n\\n' -%}{%- set rest = messages[1:] -%}\
{%- else -%}{%- set first_user_prefix = '' -%}{%- set rest = messages -%}{%- endif -%}\
{%- for m in rest -%}\
{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{%- endif -%}\
{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' \
+ (first_user_prefix if loop.first else '') + (m.content | trim) + '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

/// Template instructions one rendering may run: a bound on a hostile template (one that
/// loops a billion times) far above what a real template spends on any conversation that
/// fits in a request body (a test renders 20,000 turns within it).
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of those tokens, which templates print.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template comes with the model file: one that loops without end must fail a
        // request, not hold a worker forever.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| strftime_today(&fmt));
        // Templates are written for Python's Jinja: string methods (`startswith`, `split`,
        // `strip`) and transformers' `tojson` (json.dumps: `", "` and `": "`, keys in order,
        // no HTML escaping) must behave as there.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python_tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders the prompt for `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, &ChatOptions::default())
    }

    /// [`Self::render`] with tools and more variables. The variables come first, as
    /// transformers passes them: they may replace `bos_token`, not the messages.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut vars = serde_json::Map::new();
        vars.insert("bos_token".into(), Value::from(self.bos.clone()));
        vars.insert("eos_token".into(), Value::from(self.eos.clone()));
        vars.extend(options.kwargs.clone());
        tmpl.render(context! {
            messages => template_messages(messages)?,
            tools => options.tools,
            add_generation_prompt => add_generation_prompt,
            ..JinjaValue::from_serialize(&vars)
        })
        .map_err(|e| TokenizerError::Template(e.to_string()))
    }

    /// The template's source text (to tell which tool-call format a model speaks).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads a `tools` variable at all: one that does not cannot show
    /// the model its functions.
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`, keys in
/// their order, `", "` and `": "` between items (`","` before a newline when indented).
fn python_tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted as Python's json.dumps takes them; keys are always kept in order.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            json.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonCompact);
            json.serialize(&mut ser)
        }
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(JinjaValue::from_safe_string(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// Python's default JSON separators: `", "` between items, `": "` after keys.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `", "` before every array item and object key but the first.
fn item_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// Today's date (UTC) for templates that print one; supports %Y %m %d %e %b %B.
fn strftime_today(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%e", &d.to_string())
        .replace("%B", name)
        .replace("%b", &name[..3])
}

/// Days since 1970-01-01 -> (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The messages as the template sees them: a message with media parts has them as its
/// content list.
fn template_messages(messages: &[ChatMessage]) -> Result<Vec<Value>, TokenizerError> {
    messages
        .iter()
        .map(|m| {
            let mut v =
                serde_json::to_value(m).map_err(|e| TokenizerError::Template(e.to_string()))?;
            if !m.parts.is_empty() {
                v["content"] = Value::Array(m.parts.iter().map(ChatPart::to_json).collect());
            }
            Ok(v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_endless_template_fails_and_real_ones_fit_the_fuel() {
        // 10^12 iterations: a template that would never finish.
        let endless = "{% for i in range(10000) %}{% for j in range(10000) %}\
                       {% for k in range(10000) %}{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(endless, "<s>", "</s>").unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
        // A long conversation through Gemma's template stays within it.
        let turns: Vec<ChatMessage> = (0..20_000)
            .map(|i| {
                ChatMessage::text(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    &format!("turn {i}"),
                )
            })
            .collect();
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let text = t.render(&turns, true).unwrap();
        assert!(text.ends_with("<start_of_turn>model\n"));
    }

    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn gemma_template_folds_system_and_opens_model_turn() {
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let msgs = [
            ChatMessage::text("system", "Be brief."),
            ChatMessage::text("user", "Hi"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        let bad = [ChatMessage::text("assistant", "x")];
        assert!(t
            .render(&bad, true)
            .unwrap_err()
            .to_string()
            .contains("alternate"));
    }
}
