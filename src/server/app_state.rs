//! The state every handler shares: the loaded models once ready, the server's limits and
//! settings, and the signals of its shutdown.
//!
//! Why it exists: it is built once when the server starts (`lifecycle`) and read by every
//! handler, so it lives apart from both.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use super::error::ApiError;
use super::responses_store::ResponseStore;
use super::startup::Loaded;

/// Shared by every handler.
pub struct AppState {
    /// Set once the models are loaded and the engine runs.
    pub(super) loaded: OnceLock<Loaded>,
    pub(super) metrics: Option<PrometheusHandle>,
    pub(super) admin_token: Option<String>,
    /// The inference API's keys (none: open).
    pub(super) api_keys: super::api_keys::ApiKeys,
    /// `/metrics` sits behind the keys too.
    pub(super) metrics_require_key: bool,
    /// `/` serves the web page.
    pub(super) web_page: bool,
    /// Tokens generated per second lately, for the load report.
    pub(super) throughput: super::throughput::ThroughputMeter,
    pub(super) max_body_bytes: usize,
    pub(super) defaults: crate::config::GenerationDefaults,
    /// Set on SIGTERM: `/health` answers 503 so balancers route new work elsewhere.
    pub(super) draining: AtomicBool,
    /// Longest a client may take to send a request body.
    pub(super) body_timeout: Duration,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    pub(super) responses: ResponseStore,
    /// Turns true when the shutdown grace period ends: requests still running end in words
    /// (a stream's last events are a finish reason, an error and `[DONE]`; a waiting
    /// response becomes a 503) instead of a cut connection.
    pub(super) cutoff: tokio::sync::watch::Sender<bool>,
}

impl AppState {
    /// A new request id such as `chatcmpl-5f3a…`: 128 random bits, so no id tells another.
    pub(super) fn new_request_id(&self, kind: &str) -> String {
        super::ids::fresh_id(kind, '-')
    }

    pub(super) fn ready(&self) -> Result<&Loaded, ApiError> {
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
