//! The HTTP routes, and the endpoints small enough to answer in place: `/health`, `/metrics`
//! and the answers for an unknown route or method; and the API keys' layer in front of the
//! inference routes.
//!
//! Why it exists: the whole API's surface reads in one table, apart from the handlers behind it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};

use super::error::ApiError;
use super::{admin, loads, openai, page, render, responses, tokenize, AppState};
use crate::engine::EngineHealth;

/// The routes, on a given state: the inference API behind the API keys (`api_keys`), `/health`
/// always open, `/metrics` and the load reports open unless `server.metrics_require_key`, the
/// admin API behind its own token.
pub fn router(state: Arc<AppState>) -> Router {
    let mut keyed = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/completions/render", post(render::completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize));
    let mut open = Router::new().route("/health", get(health));
    if state.web_page {
        // The page holds no data: it asks for the API key and sends it with its own requests.
        open = open.route("/", get(page::page));
    }
    // What a router reads to balance replicas goes where `/metrics` goes.
    let watched = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/loads", get(loads::loads))
        .route("/loads", get(loads::loads))
        .route("/get_load", get(loads::get_load));
    if state.metrics_require_key {
        keyed = keyed.merge(watched);
    } else {
        open = open.merge(watched);
    }
    let keyed = keyed.route_layer(middleware::from_fn_with_state(
        Arc::clone(&state),
        require_api_key,
    ));
    keyed
        .merge(open)
        // Every method reaches the admin handler, which checks the token before the method:
        // a caller without the token learns nothing, not even which methods exist.
        .route("/admin/speculation", any(admin::speculation))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The layer in front of the inference routes: a request without a valid key gets a 401 with
/// an OpenAI-style body (and `WWW-Authenticate: Bearer`); one with a key carries its
/// [`Tenant`](super::api_keys::Tenant) to the handler.
async fn require_api_key(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    match state.api_keys.identify(request.headers()) {
        Ok(tenant) => {
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        Err(e) => {
            tracing::info!(path = %request.uri().path(), "request without a valid API key refused");
            let mut response = e.into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
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
        EngineHealth::Ok if loaded.engine.logits_broken() => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "broken_model",
                "reason": "the model's last forward gave NaN or infinite logits",
            })),
        )
            .into_response(),
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

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("No route for {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
