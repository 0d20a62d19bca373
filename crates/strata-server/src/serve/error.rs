//! OpenAI-style JSON errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The field at fault: a request parameter, or a part of one (`messages[0].content[1]`).
    pub param: Option<std::borrow::Cow<'static, str>>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// [`Self::invalid`] for a field named at run time (a part of a parameter).
    pub fn invalid_owned(param: String, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
        }
    }

    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.event_json();
        let mut resp = (self.status, Json(body)).into_response();
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            // A place frees when any running request ends, typically within a second.
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, 1.into());
        }
        resp
    }
}

/// The error a request ended by the engine for `reason` gets, if that reason is an error:
/// 500 for a failure, 504 past `--request-timeout`, 503 past `--queue-timeout`.
pub fn for_finish(reason: &str, error: Option<String>) -> Option<ApiError> {
    let (status, message) = match reason {
        "error" => (
            StatusCode::INTERNAL_SERVER_ERROR,
            error.unwrap_or_else(|| "generation failed".into()),
        ),
        "timeout" => (
            StatusCode::GATEWAY_TIMEOUT,
            "the request ran longer than the server's --request-timeout".into(),
        ),
        "queue_timeout" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is saturated: the request waited longer than --queue-timeout to start"
                .into(),
        ),
        _ => return None,
    };
    Some(ApiError::status(status, message))
}

/// An engine error about request field `param`: the caller's fault (400, naming the
/// field) or the server's (its own status).
pub fn about(param: &'static str, e: strata_engine::EngineError) -> ApiError {
    use strata_engine::EngineError as E;
    match e {
        E::Invalid(m) => ApiError::invalid(param, m),
        // Tokenizing or templating a request fails on what the request holds (text the
        // pre-tokenizer gives up on, turns the template refuses).
        E::Tokenizer(t) => ApiError::invalid(param, t.to_string()),
        other => other.into(),
    }
}

impl ApiError {
    /// The error as one event of a stream whose status line has already gone out.
    pub fn event_json(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl From<strata_engine::EngineError> for ApiError {
    fn from(e: strata_engine::EngineError) -> Self {
        use strata_engine::EngineError as E;
        let status = match &e {
            E::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            E::Stopped => StatusCode::SERVICE_UNAVAILABLE,
            E::Invalid(_) => StatusCode::BAD_REQUEST,
            E::NotFound(_) => StatusCode::NOT_FOUND,
            E::Tokenizer(strata_tokenizer::TokenizerError::Input(_)) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::status(status, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_engine::EngineError as E;
    use strata_tokenizer::TokenizerError as T;

    /// The caller's faults are 4xx naming the field; the server's are 5xx.
    #[test]
    fn engine_errors_map_to_their_status() {
        let cases: [(E, u16, Option<&str>); 6] = [
            (E::Invalid("bad".into()), 400, Some("prompt")),
            (E::Tokenizer(T::Input("long".into())), 400, Some("prompt")),
            (
                E::Tokenizer(T::Template("turns".into())),
                400,
                Some("prompt"),
            ),
            (E::Internal("broke".into()), 500, None),
            (E::QueueFull(8), 429, None),
            (E::Stopped, 503, None),
        ];
        for (e, status, param) in cases {
            let what = e.to_string();
            let api = about("prompt", e);
            assert_eq!(api.status.as_u16(), status, "{what}");
            assert_eq!(api.param.as_deref(), param, "{what}");
        }
        assert_eq!(
            ApiError::from(E::Invalid("x".into())).status,
            StatusCode::BAD_REQUEST
        );
    }
}
