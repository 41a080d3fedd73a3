//! A server's life: bind the port first (so `/health` can say "loading"), load the models in
//! the background, serve, and on SIGTERM drain, give in-flight requests their grace period,
//! then end what still runs in words.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use super::api_keys::{is_loopback, ApiKeys};
use super::responses_store::{ResponseStore, StoreLimits};
use super::{listen, reload, router, startup, AppState, ServerError};
use crate::config::Config;

/// Runs the server until SIGTERM/Ctrl-C. `threads` is the runtime's compute thread count;
/// `config_path`, the file the config came from, is watched for speculation settings (and
/// reread on SIGHUP).
pub async fn run(
    config: Config,
    threads: usize,
    config_path: Option<std::path::PathBuf>,
) -> Result<(), ServerError> {
    let metrics = install_metrics(&config)?;
    let admin_token = admin_token(&config)?;
    let api_keys = ApiKeys::gather(
        &config.server,
        std::env::var("TANDEM_API_KEY").ok().as_deref(),
    )?;
    let addr = format!("{}:{}", config.server.host, config.server.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| ServerError::Bind {
            addr: addr.clone(),
            reason: e.to_string(),
        })?;
    let local: SocketAddr = listener.local_addr()?;
    let state = Arc::new(new_state(&config, metrics, admin_token, api_keys));
    tracing::info!(%local, "listening on http://{local} (loading models; /health is 503 until ready)");
    reload::spawn(config_path, {
        let state = Arc::clone(&state);
        move || state.loaded.get().map(|l| l.engine.settings().clone())
    });
    if state.admin_token.is_none() {
        tracing::info!("admin API off (set server.admin_token or TANDEM_ADMIN_TOKEN)");
    }
    tell_who_may_use_it(&state, &config.server.host);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let app = router(Arc::clone(&state));
    let header_timeout = Duration::from_secs(config.server.header_timeout_seconds);
    let server = tokio::spawn(listen::serve(listener, app, header_timeout, stop_rx));

    tokio::select! {
        r = load_models(Arc::clone(&state), config.clone(), threads) => r?,
        _ = shutdown_signal() => {
            tracing::info!("shutting down before the models finished loading");
            return Ok(());
        }
    }

    shutdown_signal().await;
    drain(&state, &config).await;
    stop(&state, &config, stop_tx, server).await
}

/// Installs the Prometheus recorder and exports the series that must read zero, not "no
/// data", before their first sample.
fn install_metrics(config: &Config) -> Result<PrometheusHandle, ServerError> {
    let metrics = crate::telemetry::install().map_err(|e| ServerError::Metrics(e.to_string()))?;
    crate::telemetry::register_positions(config.engine.gamma_limit);
    crate::telemetry::register_config_reloads();
    crate::telemetry::register_draft_gate();
    crate::telemetry::register_trees();
    crate::telemetry::register_constraints();
    crate::telemetry::register_speculation();
    crate::telemetry::register_engine_health();
    Ok(metrics)
}

/// Logs whether the inference API needs a key, and warns once when a server reachable from
/// other machines takes requests from anyone.
fn tell_who_may_use_it(state: &AppState, host: &str) {
    if state.api_keys.required() {
        tracing::info!(
            keys = state.api_keys.count(),
            metrics_require_key = state.metrics_require_key,
            "the inference API needs an API key"
        );
    } else if !is_loopback(host) {
        tracing::warn!(
            %host,
            "no API key is set and the server listens beyond this machine: anyone who reaches \
             it may use the API and read the responses it stores; set --api-key, \
             server.api_keys, TANDEM_API_KEY or server.api_keys_file"
        );
    }
}

/// The handlers' shared state, before the models load.
fn new_state(
    config: &Config,
    metrics: PrometheusHandle,
    admin_token: Option<String>,
    api_keys: ApiKeys,
) -> AppState {
    AppState {
        loaded: OnceLock::new(),
        metrics: Some(metrics),
        admin_token,
        metrics_require_key: config.server.metrics_require_key && api_keys.required(),
        web_page: config.server.web_page,
        throughput: Default::default(),
        api_keys,
        max_body_bytes: config.server.max_body_bytes,
        defaults: config.generation.clone(),
        draining: AtomicBool::new(false),
        body_timeout: Duration::from_secs(config.server.body_timeout_seconds),
        responses: ResponseStore::new(StoreLimits {
            count: config.server.responses_stored,
            ttl: Duration::from_secs(config.server.responses_ttl_seconds),
            bytes: config.server.responses_stored_bytes,
        }),
        cutoff: tokio::sync::watch::channel(false).0,
    }
}

/// Loads the models and starts the engine; from then on the handlers answer.
async fn load_models(
    state: Arc<AppState>,
    config: Config,
    threads: usize,
) -> Result<(), ServerError> {
    let loaded = startup::start(config, threads).await?;
    tracing::info!(
        model = %loaded.model_name,
        drafter = %loaded.drafter,
        "ready"
    );
    let live = loaded.engine.settings().get();
    crate::telemetry::set_speculation(live.lenience.get(), live.gamma_gauge());
    crate::telemetry::register_vllm_aliases(&loaded.model_name);
    let _ = state.loaded.set(loaded);
    Ok(())
}

/// Turns `/health` to 503 and keeps serving for `server.drain_seconds`, so balancers move new
/// work elsewhere before connections are refused.
async fn drain(state: &AppState, config: &Config) {
    state.draining.store(true, Ordering::Relaxed);
    let period = Duration::from_secs(config.server.drain_seconds);
    if !period.is_zero() {
        tracing::info!(
            drain_seconds = config.server.drain_seconds,
            "draining: /health is 503, requests are still served until the drain ends"
        );
        // A second signal ends the drain early.
        tokio::select! {
            _ = tokio::time::sleep(period) => {},
            _ = shutdown_signal() => {},
        }
    }
}

/// Stops accepting connections, gives in-flight requests the grace period, then ends what
/// still runs in words.
async fn stop(
    state: &AppState,
    config: &Config,
    stop_tx: tokio::sync::watch::Sender<bool>,
    mut server: tokio::task::JoinHandle<()>,
) -> Result<(), ServerError> {
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
