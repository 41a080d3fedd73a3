//! The server's errors: OpenAI-style error responses for clients (`ApiError`), and why the
//! server itself could not start or stopped (`ServerError`).
//!
//! Why it exists: clients (the `openai` package among them) expect every failure as
//! `{"error": {"message", "type", "param", "code"}}` with a meaningful status, so every rejection
//! the server makes, from malformed JSON to an overloaded queue, goes through this one type.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::engine::EngineError;
use crate::model::ModelError;

/// A client's string inside an error message: at most 64 characters, line breaks (U+2028 and
/// U+2029 too) and other control characters escaped, so it can neither flood nor break a log
/// line, and the client sees what the log shows.
pub(super) fn escaped_for_message(s: &str) -> String {
    let cut: String = s.chars().take(64).collect();
    cut.escape_debug().to_string()
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request itself is wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message.into(),
        )
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(message);
        e.param = Some(param.to_string());
        e
    }

    pub fn model_not_found(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "The model `{}` does not exist; this server serves `{served}`.",
                escaped_for_message(model)
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than the server's limit of {limit} bytes."),
        )
    }

    pub fn body_timeout(seconds: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("The request body did not arrive within {seconds} seconds."),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not take {method} requests."),
        )
    }

    /// 503 for a response the shutdown grace period ended before it finished.
    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The server is shutting down; this request was ended before it finished.",
        );
        e.code = Some("server_shutting_down");
        e
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
        e.code = Some("invalid_api_key");
        e
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn loading() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The models are still loading; retry shortly.",
        );
        e.retry_after = Some(1);
        e
    }

    /// 503: the server cannot take this request now; retry in a second.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(1);
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body, also sent as an SSE event when a stream fails part-way.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded { .. } => {
                let mut a = Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    format!("The server is overloaded: {e}."),
                );
                a.code = Some("rate_limit_exceeded");
                a.retry_after = Some(1);
                a
            }
            EngineError::InvalidRequest(_)
            | EngineError::EmptyPrompt
            | EngineError::PromptTooLong { .. }
            | EngineError::Sampling(_) => Self::invalid(e.to_string()),
            EngineError::GrammarTooComplex(_) => {
                let mut a = Self::invalid(format!("Generation failed: {e}"));
                a.code = Some(crate::engine::GRAMMAR_TOO_COMPLEX);
                a
            }
            other => Self::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Why `tandem serve` could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("draft model: {0}")]
    Draft(String),
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: String, reason: String },
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("start-up: {0}")]
    Startup(String),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}
