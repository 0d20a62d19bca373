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
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        (self.status, Json(body)).into_response()
    }
}

impl From<strata_engine::EngineError> for ApiError {
    fn from(e: strata_engine::EngineError) -> Self {
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}
