//! The admin API: read and change speculation settings while the server runs.
//!
//! Why it exists: lenience and γ are the knobs an operator turns under live traffic (lower
//! lenience in a spike, a fixed γ while investigating); changes apply from the next round with
//! no restart. Guarded by a bearer token; with none configured the routes refuse and say why.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method};
use axum::Json;
use serde_json::{json, Value};

use super::api_keys::{bearer_token, same_secret};
use super::error::ApiError;
use super::schema::parse_body;
use super::{read_body, AppState};
use crate::engine::{SpeculationKnobs, SpeculationSettings};

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::not_found(
            "The admin API is off: set server.admin_token in the config or TANDEM_ADMIN_TOKEN.",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or_else(|| ApiError::unauthorized("Send `Authorization: Bearer <admin token>`."))?;
    if !same_secret(given.as_bytes(), token.as_bytes()) {
        return Err(ApiError::unauthorized("Wrong admin token."));
    }
    Ok(())
}

fn settings_json(s: &SpeculationSettings, state: &AppState) -> Result<Value, ApiError> {
    let loaded = state.ready()?;
    let mut v = serde_json::to_value(s).map_err(|e| ApiError::internal(e.to_string()))?;
    v["max_gamma"] = json!(loaded.engine.settings().gamma_limit());
    v["drafter"] = json!(loaded.drafter);
    v["drafter_loaded"] = json!(loaded.engine.has_drafter());
    Ok(v)
}

/// `/admin/speculation`: `GET` reads the settings, `PUT` changes them; any other method is a
/// 405, told only to a caller with the token.
pub async fn speculation(
    State(state): State<Arc<AppState>>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    match method {
        Method::GET => get_speculation(&state),
        Method::PUT => put_speculation(&state, body).await,
        other => Err(ApiError::method_not_allowed(
            other.as_str(),
            "/admin/speculation",
        )),
    }
}

fn get_speculation(state: &AppState) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    Ok(Json(settings_json(&loaded.engine.settings().get(), state)?))
}

async fn put_speculation(state: &AppState, body: Body) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(state, body).await?;
    let update: SpeculationKnobs = parse_body(&bytes)?;
    let loaded = state.ready()?;
    let before = loaded.engine.settings().get();
    let after = loaded
        .engine
        .settings()
        .update(&update)
        .map_err(|e| ApiError::invalid_param(e.key, format!("{e}")))?;
    crate::telemetry::set_speculation(after.lenience.get(), after.gamma_gauge());
    tracing::info!(
        change = %crate::engine::speculation_settings::describe_change(&before, &after),
        "admin changed the speculation settings"
    );
    Ok(Json(settings_json(&after, state)?))
}
