//! `echo` on completions: the prompt's text, and with `logprobs` its tokens' logprobs,
//! ahead of the completion's, as evaluation harnesses ask for them (the logprob of a
//! continuation given its context is the sum over its echoed tokens).

use axum::http::StatusCode;
use serde_json::Value;
use strata_kernels::sampling::TokenLogprobs;

use super::error::ApiError;
use super::routes::{logprob_entry, AppState, Kind};

/// What a choice echoes: the prompt as the client sent it (or its ids decoded) and its ids.
#[derive(Clone)]
pub struct Echo {
    /// Text put before the completion's.
    pub text: String,
    /// The prompt's ids, whose pieces lead the `logprobs` tokens.
    pub ids: Vec<u32>,
}

/// The completions `logprobs` entries of the prompt: its first token has no logprob (null,
/// as OpenAI and vLLM give it), each later one its logprob given the tokens before it.
pub fn prompt_entries(
    st: &AppState,
    echo: &Echo,
    scores: &[TokenLogprobs],
) -> Result<Vec<Value>, ApiError> {
    if scores.len() + 1 != echo.ids.len() {
        return Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the engine scored {} of the prompt's {} tokens",
                scores.len(),
                echo.ids.len().saturating_sub(1)
            ),
        ));
    }
    let mut entries = Vec::with_capacity(echo.ids.len());
    for (p, &id) in echo.ids.iter().enumerate() {
        entries.push(match p {
            0 => {
                let mut e = logprob_entry(st, Kind::Completion, id, 0.0, &[]);
                e["logprob"] = Value::Null;
                e["top"] = Value::Null;
                e
            }
            _ => {
                let s = &scores[p - 1];
                logprob_entry(st, Kind::Completion, id, s.logprob, &s.top)
            }
        });
    }
    Ok(entries)
}

/// `echo` with a streamed answer is refused: a harness reads the prompt's logprobs whole.
pub fn check_not_streamed(echo: bool, stream: bool) -> Result<(), ApiError> {
    if echo && stream {
        return Err(ApiError::invalid(
            "echo",
            "echo is answered whole: send it with stream false",
        ));
    }
    Ok(())
}
