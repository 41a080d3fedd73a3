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
mod listen;
mod logprobs;
pub mod openai;
mod reload;
mod response;
pub mod schema;
pub mod startup;
mod tokenize;
mod validation;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::engine::EngineHealth;
use error::ApiError;
pub use error::ServerError;
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

/// Runs the server until SIGTERM/Ctrl-C. `threads` is the runtime's compute thread count;
/// `config_path`, the file the config came from, is watched for speculation settings (and
/// reread on SIGHUP).
pub async fn run(
    config: Config,
    threads: usize,
    config_path: Option<std::path::PathBuf>,
) -> Result<(), ServerError> {
    let metrics = crate::telemetry::install().map_err(|e| ServerError::Metrics(e.to_string()))?;
    crate::telemetry::register_positions(config.engine.max_gamma);
    crate::telemetry::register_config_reloads();
    crate::telemetry::register_draft_gate();
    crate::telemetry::register_trees();
    crate::telemetry::register_speculation();
    crate::telemetry::register_engine_health();
    let admin_token = admin_token(&config)?;
    let addr = format!("{}:{}", config.server.host, config.server.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| ServerError::Bind {
            addr: addr.clone(),
            reason: e.to_string(),
        })?;
    let local: SocketAddr = listener.local_addr()?;
    let state = Arc::new(AppState {
        loaded: OnceLock::new(),
        metrics: Some(metrics),
        admin_token,
        max_body_bytes: config.server.max_body_bytes,
        defaults: config.generation.clone(),
        id_prefix: format!("{:08x}", std::process::id() ^ (local.port() as u32) << 16),
        next_request: AtomicU64::new(0),
        draining: AtomicBool::new(false),
        body_timeout: Duration::from_secs(config.server.body_timeout_seconds),
        cutoff: tokio::sync::watch::channel(false).0,
    });
    tracing::info!(%local, "listening on http://{local} (loading models; /health is 503 until ready)");
    reload::spawn(config_path, {
        let state = Arc::clone(&state);
        move || state.loaded.get().map(|l| l.engine.settings().clone())
    });
    if state.admin_token.is_none() {
        tracing::info!("admin API off (set server.admin_token or TANDEM_ADMIN_TOKEN)");
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let app = router(Arc::clone(&state));
    let header_timeout = Duration::from_secs(config.server.header_timeout_seconds);
    let mut server = tokio::spawn(listen::serve(listener, app, header_timeout, stop_rx));

    let load = {
        let state = Arc::clone(&state);
        let config = config.clone();
        async move {
            let loaded = startup::start(config, threads).await?;
            tracing::info!(
                model = %loaded.model_name,
                drafter = %loaded.drafter,
                "ready"
            );
            let live = loaded.engine.settings().get();
            crate::telemetry::set_speculation(live.lenience.get(), live.gamma_gauge());
            let _ = state.loaded.set(loaded);
            Ok::<(), ServerError>(())
        }
    };
    tokio::select! {
        r = load => r?,
        _ = shutdown_signal() => {
            tracing::info!("shutting down before the models finished loading");
            return Ok(());
        }
    }

    shutdown_signal().await;
    state.draining.store(true, Ordering::Relaxed);
    let drain = Duration::from_secs(config.server.drain_seconds);
    if !drain.is_zero() {
        tracing::info!(
            drain_seconds = config.server.drain_seconds,
            "draining: /health is 503, requests are still served until the drain ends"
        );
        // A second signal ends the drain early.
        tokio::select! {
            _ = tokio::time::sleep(drain) => {},
            _ = shutdown_signal() => {},
        }
    }
    tracing::info!(
        grace_seconds = config.server.shutdown_grace_seconds,
        "shutting down: no new connections; in-flight requests may finish"
    );
    let _ = stop_tx.send(true);
    let grace = Duration::from_secs(config.server.shutdown_grace_seconds);
    match tokio::time::timeout(grace, &mut server).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => return Err(ServerError::Startup(format!("server task: {e}"))),
        Err(_) => {}
    }
    tracing::warn!("grace period over; ending the remaining requests with an error");
    // Kept even with no response subscribed yet: one that subscribes later sees it at once.
    state.cutoff.send_replace(true);
    // The ended responses' last events reach their clients, and the connections close.
    if tokio::time::timeout(CUTOFF_FLUSH, server).await.is_err() {
        tracing::warn!("connections still open after the cut-off; closing them");
    }
    Ok(())
}

/// How long ended responses get to reach their clients after the grace period.
const CUTOFF_FLUSH: Duration = Duration::from_secs(2);

/// The admin token from `TANDEM_ADMIN_TOKEN` or `server.admin_token` (empty: the admin API is
/// off). Surrounding whitespace is not part of it (requests' tokens are trimmed too); a token
/// of whitespace alone would turn the API on with no way to authenticate, so it is refused.
fn admin_token(config: &Config) -> Result<Option<String>, ServerError> {
    let (source, token) = match std::env::var("TANDEM_ADMIN_TOKEN") {
        Ok(t) if !t.is_empty() => ("TANDEM_ADMIN_TOKEN", t),
        _ => ("server.admin_token", config.server.admin_token.clone()),
    };
    if token.is_empty() {
        return Ok(None);
    }
    let trimmed = token.trim();
    if trimmed.is_empty() {
        return Err(ServerError::Startup(format!(
            "{source} is only whitespace: give a real token, or leave it empty to turn the admin API off"
        )));
    }
    Ok(Some(trimmed.to_string()))
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
