//! `/tokenize` and `/detokenize`, in vLLM's request and response shapes: what a client
//! needs to count tokens or build prompts of ids without a tokenizer of its own.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{chat_messages, Message};
use super::error::{about, ApiError};
use super::routes::{check_model, tokenize_on_pool, ApiJson, Shared};

/// A prompt or a conversation to tokenize.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    model: Option<String>,
    /// Raw text, tokenized as the completions endpoint does.
    prompt: Option<String>,
    /// A conversation, rendered with the model's chat template as the chat endpoint does.
    messages: Option<Vec<Message>>,
    /// BOS where the model adds one (default: true for a prompt; a conversation's template
    /// writes its own).
    add_special_tokens: Option<bool>,
    /// Only the chat endpoint's form, with the assistant's turn opened, is rendered.
    add_generation_prompt: Option<bool>,
    /// Also return each token's text.
    return_token_strs: Option<bool>,
    /// Tools shown to the template, as the chat endpoint shows them.
    tools: Option<Value>,
    /// More template variables, as the chat endpoint takes them.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

pub async fn tokenize(
    State(st): State<Shared>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    check_model(&st, &req.model)?;
    super::routes::tokenizer(&st)?;
    let tok = st.engine.tokenizer.clone();
    let ids = match (req.prompt, req.messages) {
        (Some(text), None) => {
            super::routes::check_prompt_bytes(&st, "prompt", text.len())?;
            let add_special = req.add_special_tokens.unwrap_or(true);
            tokenize_on_pool(&st, move |p| match &tok {
                Some(t) if !add_special => Ok(t.encode(&text, false, true)?),
                _ => p.encode_prompt(&text),
            })
            .await
            .map_err(|e| about("prompt", e))?
        }
        (None, Some(messages)) => {
            if req.add_generation_prompt == Some(false) {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "only the chat endpoint's rendering (add_generation_prompt: true) is supported",
                ));
            }
            if req.add_special_tokens == Some(true) {
                return Err(ApiError::invalid(
                    "add_special_tokens",
                    "a conversation's template writes its own special tokens",
                ));
            }
            let messages = chat_messages(&messages)?;
            let bytes = messages.iter().map(|m| m.content.len()).sum();
            super::routes::check_prompt_bytes(&st, "messages", bytes)?;
            let kwargs = super::api::check_template_kwargs(req.chat_template_kwargs.as_ref())?;
            let plan = super::tools::plan_of(
                req.tools.as_ref(),
                None,
                None,
                st.engine.prompter.chat_template(),
                st.tool_parser,
            )?;
            let (messages, mut options) = match &plan {
                Some(p) => super::tools::render_input(p, messages),
                None => (messages, Default::default()),
            };
            options.kwargs = kwargs;
            tokenize_on_pool(&st, move |p| p.encode_chat_with(&messages, &options))
                .await
                .map_err(|e| about("messages", e))?
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "send exactly one of prompt and messages",
            ))
        }
    };
    let mut body = json!({
        "count": ids.len(),
        "max_model_len": st.engine.context_len,
        "tokens": ids,
        "token_strs": Value::Null,
    });
    if req.return_token_strs == Some(true) {
        let tok = super::routes::tokenizer(&st)?;
        // Each token's text as it appears in decoded output (a token holding part of a
        // character shows U+FFFD), rather than the vocabulary's own spelling.
        let strs: Vec<String> = ids
            .iter()
            .map(|&id| tok.decode(&[id], true).unwrap_or_default())
            .collect();
        body["token_strs"] = json!(strs);
    }
    Ok(Json(body))
}

/// Token ids to turn back into text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(st): State<Shared>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    check_model(&st, &req.model)?;
    let tok = super::routes::tokenizer(&st)?;
    if let Some(&bad) = req
        .tokens
        .iter()
        .find(|&&t| t as usize >= st.engine.vocab_size)
    {
        return Err(ApiError::invalid(
            "tokens",
            format!(
                "token id {bad} is outside the vocabulary of {}",
                st.engine.vocab_size
            ),
        ));
    }
    // Special tokens are written out, as vLLM's endpoint does.
    let text = tok
        .decode(&req.tokens, true)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({ "prompt": text })))
}

/// `GET /tokenizer_info`, in vLLM's shape: the special tokens' text and the chat template,
/// what a client with no tokenizer of its own (lm-evaluation-harness's remote tokenizer)
/// needs besides `/tokenize` and `/detokenize`.
pub async fn tokenizer_info(State(st): State<Shared>) -> Result<Json<Value>, ApiError> {
    let tok = super::routes::tokenizer(&st)?;
    // A special token's own text, as `/detokenize` writes it.
    let text = |id: Option<u32>| id.and_then(|id| tok.decode(&[id], true).ok());
    Ok(Json(json!({
        "tokenizer_class": "strata",
        "bos_token": text(tok.bos_id()),
        "eos_token": text(tok.eos_id()),
        "pad_token": Value::Null,
        // The template in use (`--chat-template` replaces the model's).
        "chat_template": st.engine.prompter.chat_template().map(|t| t.source()),
        "model_max_length": st.engine.context_len,
        "vocab_size": st.engine.vocab_size,
    })))
}
