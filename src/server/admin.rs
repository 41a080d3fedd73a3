//! The admin API: read and change speculation settings while the server runs.
//!
//! Why it exists: lenience and γ are the knobs an operator turns under live traffic (lower
//! lenience in a spike, a fixed γ while investigating); changes apply from the next round with
//! no restart. Guarded by a bearer token; with none configured the routes refuse and say why.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::schema::parse_body;
use super::{read_body, AppState};
use crate::engine::{SpeculationOverride, SpeculationSettings};

/// Compares in time independent of where the strings differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header value, trimmed. The scheme's name
/// is matched in any case: HTTP auth schemes are case-insensitive (RFC 7235), and clients and
/// proxies send `bearer` too.
fn bearer_token(value: &str) -> Option<&str> {
    const SCHEME: &str = "Bearer ";
    let scheme = value.get(..SCHEME.len())?;
    scheme
        .eq_ignore_ascii_case(SCHEME)
        .then(|| value[SCHEME.len()..].trim())
}

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

pub async fn get_speculation(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let loaded = state.ready()?;
    Ok(Json(settings_json(
        &loaded.engine.settings().get(),
        &state,
    )?))
}

pub async fn put_speculation(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let bytes = read_body(&state, body).await?;
    let update: SpeculationOverride = parse_body(&bytes)?;
    let loaded = state.ready()?;
    let before = loaded.engine.settings().get();
    let after = loaded
        .engine
        .settings()
        .update(&update)
        .map_err(|e| ApiError::invalid_param(e.key, format!("{e}")))?;
    crate::telemetry::set_speculation(after.lenience.get(), after.gamma_gauge());
    tracing::info!(
        change = %crate::engine::settings::describe_change(&before, &after),
        "admin changed the speculation settings"
    );
    Ok(Json(settings_json(&after, &state)?))
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, same_secret};

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for value in [
            "Bearer tok",
            "bearer tok",
            "BEARER tok",
            "bEaReR tok",
            "Bearer   tok  ",
        ] {
            assert_eq!(bearer_token(value), Some("tok"), "{value:?}");
        }
        for value in ["Basic tok", "Bearertok", "Bearer", "", "Beärer tok"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
