//! The OpenAI request bodies Strata accepts, and their validation into engine requests.
//!
//! Unknown fields are refused (a misspelt `max_tokns` should not silently become the
//! default; [`NoOtherFields`]); known OpenAI fields that Strata does not implement are refused when set to
//! anything but their neutral value.

use serde::Deserialize;
use strata_engine::GenerationRequest;
use strata_kernels::sampling::SamplingParams;
use strata_tokenizer::{ChatMessage, ChatPart};

use super::media::{MediaPart, MediaPolicy};

use super::error::ApiError;

/// `null` for a field with a default: the default (OpenAI clients send explicit nulls).
fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Whether a JSON value says "nothing": null, false, an empty list, object or string.
fn is_empty(v: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match v {
        V::Null | V::Bool(false) => true,
        V::Array(a) => a.is_empty(),
        V::Object(o) => o.is_empty(),
        V::String(s) => s.is_empty(),
        V::Number(_) | V::Bool(true) => false,
    }
}

/// A field Strata does not implement and that changes the output: refused with 400 naming
/// it unless it holds its neutral value.
fn unless_neutral(name: &'static str, neutral: bool, what: &str) -> Result<(), ApiError> {
    if neutral {
        Ok(())
    } else {
        Err(ApiError::invalid(
            name,
            format!("{name} is not supported ({what} only)"),
        ))
    }
}

/// `stop` may be one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `prompt` may be text, a list of texts, token ids, or a list of token-id lists.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_is_default")]
    pub include_usage: bool,
}

/// Refuses, by name, the first field that no other part of the request took: flattened
/// last into a request, it does what `deny_unknown_fields` does (which serde cannot combine
/// with `flatten`).
#[derive(Debug)]
pub struct NoOtherFields;

impl<'de> Deserialize<'de> for NoOtherFields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = NoOtherFields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("no other fields")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                match map.next_key::<String>()? {
                    None => Ok(NoOtherFields),
                    Some(k) => Err(serde::de::Error::custom(format_args!(
                        "unknown field `{k}`"
                    ))),
                }
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The fields both endpoints take: sampling, length, streaming, and the OpenAI fields
/// accepted without effect or only at their neutral value.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    pub n: Option<u32>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub ignore_eos: bool,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Accepted for OpenAI compatibility; not used.
    #[allow(dead_code)]
    pub user: Option<String>,
    // Sent by clients by default and without effect on the output: accepted, ignored.
    #[allow(dead_code)]
    pub store: Option<bool>,
    #[allow(dead_code)]
    pub metadata: Option<serde_json::Value>,
    #[allow(dead_code)]
    pub service_tier: Option<String>,
    #[allow(dead_code)]
    pub prompt_cache_key: Option<String>,
    #[allow(dead_code)]
    pub safety_identifier: Option<String>,
    /// Whether the model may call several tools in one answer (`tools.rs`).
    pub parallel_tool_calls: Option<bool>,
    // Logit controls and stop ids (`controls.rs`).
    pub logit_bias: Option<serde_json::Value>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u32>,
    pub stop_token_ids: Option<Vec<u32>>,
    // Structured outputs (`structured.rs`).
    pub response_format: Option<serde_json::Value>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Number of top alternatives per token (OpenAI completions style).
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
    #[serde(flatten)]
    pub common: Common,
    #[serde(flatten)]
    _no_other_fields: NoOtherFields,
}

/// Message content: a string or a list of `{"type": "text", "text": ...}` parts.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `{"url": "data:image/png;base64,..." | "https://..."}` (or the URL alone).
    pub image_url: Option<serde_json::Value>,
    /// `{"data": base64, "format": "wav" | "mp3"}`.
    pub input_audio: Option<serde_json::Value>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct Message {
    pub role: String,
    /// Null (or absent) on an assistant turn that only calls tools.
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    /// An assistant turn's calls (`tools.rs` checks and converts them).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool turn's call id.
    pub tool_call_id: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub tools: Option<serde_json::Value>,
    pub tool_choice: Option<serde_json::Value>,
    pub functions: Option<serde_json::Value>,
    pub function_call: Option<serde_json::Value>,
    pub modalities: Option<serde_json::Value>,
    pub reasoning_effort: Option<String>,
    /// More variables for the chat template (`enable_thinking`, ...); checked in
    /// [`ChatRequest::template_kwargs`].
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(flatten)]
    pub common: Common,
    #[serde(flatten)]
    _no_other_fields: NoOtherFields,
}

impl CompletionRequest {
    /// Refuses the fields that would change the output and that Strata cannot honour.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        unless_neutral(
            "suffix",
            self.suffix.as_deref().is_none_or(str::is_empty),
            "none",
        )
    }

    pub fn common(&self) -> Common {
        self.common.clone()
    }

    /// Whether the prompt comes back ahead of the completion (`echo`).
    pub fn echo(&self) -> bool {
        self.echo == Some(true)
    }
}

/// Checks the fields and builds the engine request of one completions prompt. With `echo`,
/// `max_tokens` may be 0 (the prompt alone), and `logprobs` also scores the prompt.
pub fn build_completion(
    c: &Common,
    prompt: Vec<u32>,
    logprobs: Option<usize>,
    echo: bool,
    limits: &Limits,
) -> Result<GenerationRequest, ApiError> {
    let prompt_only = echo && c.max_tokens == Some(0);
    let mut gen = if prompt_only {
        // Checked as one token (every other bound holds the same), then asked for none.
        let mut one = c.clone();
        one.max_tokens = Some(1);
        let mut gen = build(&one, prompt, logprobs, None, limits)?;
        gen.max_tokens = 0;
        gen
    } else {
        build(c, prompt, logprobs, None, limits)?
    };
    gen.prompt_logprobs = if echo { logprobs } else { None };
    Ok(gen)
}

impl ChatRequest {
    /// Refuses the fields that would change the output and that Strata cannot honour.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        unless_neutral(
            "functions",
            self.functions.as_ref().is_none_or(is_empty),
            "none",
        )?;
        // `tools` and `tool_choice` are read in `tools.rs`; the legacy `functions` are not.
        let no_call = |c: &Option<serde_json::Value>| {
            c.as_ref()
                .is_none_or(|v| is_empty(v) || matches!(v.as_str(), Some("none" | "auto")))
        };
        unless_neutral(
            "function_call",
            no_call(&self.function_call),
            "\"none\" or \"auto\"",
        )?;
        let text_only = self.modalities.as_ref().is_none_or(|m| {
            is_empty(m) || m.as_array().is_some_and(|a| a.iter().all(|x| x == "text"))
        });
        unless_neutral("modalities", text_only, "[\"text\"]")?;
        unless_neutral("reasoning_effort", self.reasoning_effort.is_none(), "none")
    }

    pub fn common(&self) -> Common {
        Common {
            max_tokens: self.max_completion_tokens.or(self.common.max_tokens),
            ..self.common.clone()
        }
    }

    /// `chat_template_kwargs`, bounded: the template's own variables (`messages`, `tools`,
    /// `add_generation_prompt`) cannot be replaced.
    pub fn template_kwargs(&self) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
        check_template_kwargs(self.chat_template_kwargs.as_ref())
    }

    /// The messages as the template's turns, and their media parts in order, as `policy`
    /// allows them.
    pub fn messages(
        &self,
        policy: &MediaPolicy,
    ) -> Result<(Vec<ChatMessage>, Vec<MediaPart>), ApiError> {
        chat_input(&self.messages, Some(policy))
    }
}

/// `chat_template_kwargs` checked: bounded, and not replacing the request's own variables.
pub fn check_template_kwargs(
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let Some(kwargs) = kwargs else {
        return Ok(Default::default());
    };
    let bytes = serde_json::Value::Object(kwargs.clone()).to_string().len();
    if kwargs.len() > MAX_TEMPLATE_KWARGS || bytes > MAX_TEMPLATE_KWARGS_BYTES {
        return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("at most {MAX_TEMPLATE_KWARGS} variables in {MAX_TEMPLATE_KWARGS_BYTES} bytes of JSON"),
            ));
    }
    if let Some(k) = kwargs
        .keys()
        .find(|k| matches!(k.as_str(), "messages" | "tools" | "add_generation_prompt"))
    {
        return Err(ApiError::invalid(
            "chat_template_kwargs",
            format!("{k} is set by the request itself"),
        ));
    }
    Ok(kwargs.clone())
}

/// Messages as the template's turns (text parts joined; `developer` is a system turn; tool
/// calls and tool answers in Hugging Face's chat format); media parts are refused.
pub fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    Ok(chat_input(messages, None)?.0)
}

/// [`chat_messages`] with the image parts of user turns, as `policy` allows them (`None`:
/// none are); each is named `messages[i].content[j]` in errors.
pub fn chat_input(
    messages: &[Message],
    policy: Option<&MediaPolicy>,
) -> Result<(Vec<ChatMessage>, Vec<MediaPart>), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut media: Vec<MediaPart> = Vec::new();
    let mut audios = 0usize;
    let turns = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if !matches!(
                m.role.as_str(),
                "system" | "user" | "assistant" | "developer" | "tool"
            ) {
                return Err(ApiError::invalid(
                    "messages",
                    format!("unknown role {:?}", m.role),
                ));
            }
            let mut parts_out = Vec::new();
            let content = match &m.content {
                // A null content is an empty text, as vLLM renders it: templates test
                // `message.content` as a string.
                None if m.role == "assistant" && m.tool_calls.is_some() => String::new(),
                None => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("a {} message needs content", m.role),
                    ))
                }
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        let field = format!("messages[{i}].content[{j}]");
                        let allowed = |what: &str| -> Result<&MediaPolicy, ApiError> {
                            let Some(policy) = policy else {
                                return Err(ApiError::invalid_owned(
                                    field.clone(),
                                    format!("{what} parts are not taken here"),
                                ));
                            };
                            if m.role != "user" {
                                return Err(ApiError::invalid_owned(
                                    field.clone(),
                                    format!("{what} parts go in user messages, not {}", m.role),
                                ));
                            }
                            Ok(policy)
                        };
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => {
                                text.push_str(t);
                                parts_out.push(ChatPart::Text(t.clone()));
                            }
                            ("image_url", _) => {
                                let policy = allowed("image_url")?;
                                if media.iter().filter(|m| !m.is_audio()).count() == policy.images {
                                    return Err(ApiError::invalid_owned(
                                        field,
                                        format!(
                                            "more than {} images in one request (--limit-mm-per-prompt image={})",
                                            policy.images, policy.images
                                        ),
                                    ));
                                }
                                let value = p.image_url.as_ref().ok_or_else(|| {
                                    ApiError::invalid_owned(
                                        field.clone(),
                                        "an image_url part needs image_url",
                                    )
                                })?;
                                media.push(super::media::image_part(field, value, policy)?);
                                parts_out.push(ChatPart::Image);
                            }
                            ("input_audio", _) => {
                                let policy = allowed("input_audio")?;
                                audios += 1;
                                if audios > policy.audios {
                                    return Err(ApiError::invalid_owned(
                                        field,
                                        format!(
                                            "more than {} audio clips in one request (--limit-mm-per-prompt audio={})",
                                            policy.audios, policy.audios
                                        ),
                                    ));
                                }
                                let value = p.input_audio.as_ref().ok_or_else(|| {
                                    ApiError::invalid_owned(
                                        field.clone(),
                                        "an input_audio part needs input_audio",
                                    )
                                })?;
                                media.push(super::media::audio_part(field, value, policy)?);
                                parts_out.push(ChatPart::Audio);
                            }
                            ("text", None) => {
                                return Err(ApiError::invalid_owned(
                                    field,
                                    "a text part needs text",
                                ))
                            }
                            (kind, _) => {
                                return Err(ApiError::invalid_owned(
                                    field,
                                    format!(
                                        "content part of type {kind:?} is not supported (text, image_url, input_audio)"
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            // Text alone stays a string, as the template has always seen it.
            if parts_out.iter().all(|p| matches!(p, ChatPart::Text(_))) {
                parts_out.clear();
            }
            let role = if m.role == "developer" {
                "system".to_string()
            } else {
                m.role.clone()
            };
            let tool_calls = match &m.tool_calls {
                Some(calls) if m.role == "assistant" => Some(super::tools::history_calls(calls)?),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "messages",
                        "only assistant messages carry tool_calls",
                    ))
                }
                None => None,
            };
            if m.role == "tool" && m.tool_call_id.is_none() {
                return Err(ApiError::invalid(
                    "messages",
                    "a tool message needs tool_call_id",
                ));
            }
            Ok(ChatMessage {
                role,
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                parts: parts_out,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((turns, media))
}

/// Variables `chat_template_kwargs` may set, and the bytes of their JSON.
pub const MAX_TEMPLATE_KWARGS: usize = 32;
/// See [`MAX_TEMPLATE_KWARGS`].
pub const MAX_TEMPLATE_KWARGS_BYTES: usize = 16 * 1024;

/// Limits the validation checks against.
pub struct Limits {
    pub context_len: usize,
    /// Tokens the whole KV pool can hold for one request.
    pub pool_tokens: usize,
    pub vocab_size: usize,
}

/// Default completion length when the request gives none (OpenAI's completions default).
const DEFAULT_MAX_TOKENS: u32 = 16;
const MAX_TOP_LOGPROBS: u32 = 20;
const MAX_STOP_STRINGS: usize = 16;
/// Bytes of one stop string. Every generated token is checked against each stop string over
/// the held-back tail, so their length is engine time per token.
const MAX_STOP_BYTES: usize = 1024;

/// Checks the shared fields and builds the engine request for `prompt` (one sample: `n`
/// and `best_of` are checked and applied by `samples.rs`).
pub fn build(
    c: &Common,
    prompt: Vec<u32>,
    logprobs: Option<usize>,
    default_max: Option<u32>,
    limits: &Limits,
) -> Result<GenerationRequest, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "token id {bad} is outside the vocabulary of {}",
                limits.vocab_size
            ),
        ));
    }
    let max_tokens = c.max_tokens.or(default_max).unwrap_or(DEFAULT_MAX_TOKENS) as usize;
    if max_tokens == 0 {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let total = prompt.len() + max_tokens;
    if total > limits.context_len {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "this model's maximum context length is {} tokens; the prompt has {} and max_tokens asks for {max_tokens} more",
                limits.context_len,
                prompt.len()
            ),
        ));
    }
    if total > limits.pool_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "prompt ({}) + max_tokens ({max_tokens}) exceeds the {} tokens the KV cache holds",
                prompt.len(),
                limits.pool_tokens
            ),
        ));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::invalid(
            "temperature",
            "temperature must be between 0 and 2",
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k",
                "top_k must be -1, 0 (off) or positive",
            ))
        }
    };
    let min_p = c.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid("min_p", "min_p must be in [0, 1]"));
    }
    if let Some(n) = logprobs {
        if n > MAX_TOP_LOGPROBS as usize {
            return Err(ApiError::invalid(
                "logprobs",
                format!("at most {MAX_TOP_LOGPROBS} top logprobs"),
            ));
        }
    }
    let stop = match &c.stop {
        None => vec![],
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP_STRINGS
        || stop
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop takes 1 to {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_BYTES} bytes"
            ),
        ));
    }
    let (controls, stop_token_ids) = super::controls::parse(c, max_tokens, limits.vocab_size)?;
    Ok(GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: c.seed,
        },
        stop,
        ignore_eos: c.ignore_eos,
        logprobs,
        prompt_logprobs: None,
        constraint: None,
        controls,
        stop_token_ids,
        shown_controls: Vec::new(),
        adapter: None,
        media: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field both endpoints share, set to `null`.
    fn shared_nulls() -> serde_json::Map<String, serde_json::Value> {
        [
            "model",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "n",
            "stream",
            "stream_options",
            "ignore_eos",
            "presence_penalty",
            "frequency_penalty",
            "user",
            "store",
            "metadata",
            "service_tier",
            "prompt_cache_key",
            "safety_identifier",
            "parallel_tool_calls",
            "logit_bias",
            "response_format",
            "repetition_penalty",
            "min_tokens",
            "stop_token_ids",
        ]
        .into_iter()
        .map(|k| (k.to_string(), serde_json::Value::Null))
        .collect()
    }

    #[test]
    fn null_is_accepted_for_every_optional_field() {
        let mut body = shared_nulls();
        body.insert("prompt".into(), json!("hi"));
        for k in ["logprobs", "echo", "suffix", "best_of"] {
            body.insert(k.into(), serde_json::Value::Null);
        }
        let req: CompletionRequest = serde_json::from_value(body.into()).unwrap();
        assert!(!req.common().stream && req.common().max_tokens.is_none());
        req.check_unsupported().unwrap();

        let mut body = shared_nulls();
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": "hi"}]),
        );
        for k in [
            "logprobs",
            "top_logprobs",
            "max_completion_tokens",
            "tools",
            "tool_choice",
            "functions",
            "function_call",
            "modalities",
            "reasoning_effort",
        ] {
            body.insert(k.into(), serde_json::Value::Null);
        }
        let req: ChatRequest = serde_json::from_value(body.into()).unwrap();
        assert!(!req.logprobs && !req.common().ignore_eos);
        req.check_unsupported().unwrap();
    }

    #[test]
    fn shared_fields_reach_common() {
        let req: ChatRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "top_k": -1,
            "stop": ["a", "b"],
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .unwrap();
        let c = req.common();
        assert_eq!((c.max_tokens, c.top_k, c.stream), (Some(7), Some(-1), true));
        assert!(c.stream_options.is_some_and(|o| o.include_usage));
        let req: CompletionRequest =
            serde_json::from_value(json!({"prompt": [1, 2], "max_tokens": 5, "seed": 3})).unwrap();
        assert_eq!(
            (req.common().max_tokens, req.common().seed),
            (Some(5), Some(3))
        );
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err =
            serde_json::from_value::<CompletionRequest>(json!({"prompt": "hi", "max_tokns": 4}))
                .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `max_tokns`"),
            "{err}"
        );
        let err = serde_json::from_value::<ChatRequest>(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "frobnicate": true,
        }))
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `frobnicate`"),
            "{err}"
        );
        // A field of the other endpoint is unknown here.
        let err = serde_json::from_value::<CompletionRequest>(
            json!({"prompt": "hi", "max_completion_tokens": 4}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("max_completion_tokens"), "{err}");
        // Nested objects still refuse theirs.
        assert!(serde_json::from_value::<CompletionRequest>(
            json!({"prompt": "hi", "stream_options": {"include_usag": true}}),
        )
        .is_err());
    }
}
