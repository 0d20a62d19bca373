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
    pub param: Option<&'static str>,
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
            param: Some(param),
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
            E::Tokenizer(strata_tokenizer::TokenizerError::Input(_)) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::status(status, e.to_string())
    }
}
