//! `tandem serve`: the OpenAI-compatible HTTP API, the admin API and `/metrics` (docs/operations.md, "HTTP API").
//!
//! Why it exists: it is how users reach the engine. The server binds its port before the models
//! load, so `/health` answers 503 while loading and orchestrators can wait on it; every
//! rejection is an OpenAI-style error; a client that goes away cancels its request (its event
//! stream is dropped with the response); SIGTERM turns `/health` to 503 ("draining") so load
//! balancers stop sending work, keeps serving for `server.drain_seconds`, then stops accepting
//! connections and gives in-flight requests a grace period to finish.

pub mod admin;
pub mod error;
mod lifecycle;
mod listen;
mod logprobs;
pub mod openai;
mod reload;
mod response;
mod responses;
mod responses_input;
mod responses_output;
mod responses_store;
pub mod schema;
pub mod startup;
mod stream;
mod structured;
mod tokenize;
mod tools;
mod validation;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::engine::EngineHealth;
use error::ApiError;
pub use error::ServerError;
pub use lifecycle::run;
use startup::Loaded;

/// Shared by every handler.
pub struct AppState {
    /// Set once the models are loaded and the engine runs.
    loaded: OnceLock<Loaded>,
    metrics: Option<PrometheusHandle>,
    admin_token: Option<String>,
    max_body_bytes: usize,
    defaults: crate::config::GenerationDefaults,
    /// Nonce making response ids unique across restarts.
    id_prefix: String,
    next_request: AtomicU64,
    /// Set on SIGTERM: `/health` answers 503 so balancers route new work elsewhere.
    draining: AtomicBool,
    /// Longest a client may take to send a request body.
    body_timeout: Duration,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    responses: responses_store::ResponseStore,
    /// Turns true when the shutdown grace period ends: requests still running end in words
    /// (a stream's last events are a finish reason, an error and `[DONE]`; a waiting
    /// response becomes a 503) instead of a cut connection.
    cutoff: tokio::sync::watch::Sender<bool>,
}

impl AppState {
    /// A new request id such as `chatcmpl-5f3a0c1e2a`: unique within the process and, through
    /// the prefix, across restarts.
    fn new_request_id(&self, kind: &str) -> String {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        format!("{kind}-{}{n:x}", self.id_prefix)
    }

    fn ready(&self) -> Result<&Loaded, ApiError> {
        self.loaded.get().ok_or_else(ApiError::loading)
    }

    /// Resolves when the shutdown grace period is over.
    pub(crate) fn cutoff(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.cutoff.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }
}

/// The routes, on a given state.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route(
            "/admin/speculation",
            get(admin::get_speculation).put(admin::put_speculation),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let unavailable = |status: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": status })),
        )
            .into_response()
    };
    if state.draining.load(Ordering::Relaxed) {
        return unavailable("draining");
    }
    let Some(loaded) = state.loaded.get() else {
        return unavailable("loading");
    };
    match loaded.engine.health() {
        EngineHealth::Ok => Json(serde_json::json!({"status": "ok"})).into_response(),
        EngineHealth::Stalled { since, waiting } => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "stalled",
                "seconds_without_round": since.as_secs_f64(),
                "waiting": waiting,
            })),
        )
            .into_response(),
        EngineHealth::Dead => unavailable("stopped"),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match &state.metrics {
        Some(h) => {
            h.run_upkeep();
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                h.render(),
            )
                .into_response()
        }
        None => ApiError::not_found("metrics are not enabled in this process").into_response(),
    }
}

/// Reads a request body up to the configured limit (413 beyond it) within the body timeout
/// (408 after it); a body that breaks off or is malformed on the wire is a 400.
pub(crate) async fn read_body(
    state: &AppState,
    body: axum::body::Body,
) -> Result<axum::body::Bytes, ApiError> {
    let read = axum::body::to_bytes(body, state.max_body_bytes);
    match tokio::time::timeout(state.body_timeout, read).await {
        Err(_) => Err(ApiError::body_timeout(state.body_timeout.as_secs())),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let mut source = std::error::Error::source(&e);
            let mut too_large = false;
            while let Some(s) = source {
                too_large |= s.is::<http_body_util::LengthLimitError>();
                source = s.source();
            }
            Err(if too_large {
                ApiError::payload_too_large(state.max_body_bytes)
            } else {
                ApiError::invalid(format!("The request body could not be read: {e}."))
            })
        }
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("No route for {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
