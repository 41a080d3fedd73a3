//! Who may use the inference API: API keys, checked by one layer in front of `/v1/*`,
//! `/tokenize` and `/detokenize` (and `/metrics` when `server.metrics_require_key` is set;
//! the layer is `routes::require_api_key`).
//!
//! Why it exists: a server reachable by more than one client must not let one read another's
//! stored conversations or spend its capacity unasked. Keys come from every place an operator
//! keeps secrets (`--api-key`, `server.api_keys`, `TANDEM_API_KEY`, a file of keys such as a
//! mounted Kubernetes Secret), are compared in constant time and are never logged. The key a
//! request authenticated with is its [`Tenant`]: what the server stores for a request (stored
//! responses) only requests of the same tenant see. With no key configured the server is open
//! and every request is the one tenant.

use std::net::IpAddr;

use axum::http::{header, HeaderMap};

use super::error::ApiError;
use super::ServerError;
use crate::config::ServerConfig;

/// Whose request this is: the index of the key it authenticated with, or the one tenant of a
/// server without keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(Option<u32>);

impl Tenant {
    /// Every request of a server without keys.
    pub const OPEN: Tenant = Tenant(None);

    /// Its prefix-cache scope: a prompt starts only from texts of its own tenant (0: the open
    /// server's one tenant).
    pub fn cache_scope(self) -> u64 {
        self.0.map_or(0, |i| u64::from(i) + 1)
    }
}

/// The inference API's keys (none: the API is open).
#[derive(Default)]
pub struct ApiKeys {
    keys: Vec<String>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        f.debug_struct("ApiKeys")
            .field("count", &self.keys.len())
            .finish()
    }
}

/// Where a key came from, to name it in an error without showing it.
fn bad_key(source: &str, why: &str) -> ServerError {
    ServerError::Startup(format!("{source}: {why}"))
}

impl ApiKeys {
    /// Gathers the keys from `server.api_keys` (with the `--api-key` flags already in it),
    /// `TANDEM_API_KEY` (`env_key`) and the file `server.api_keys_file` names, one key a line
    /// (blank lines and lines starting with `#` skipped). A key that is empty, holds white space
    /// or control characters, or a file that cannot be read stops start-up, naming where.
    pub fn gather(config: &ServerConfig, env_key: Option<&str>) -> Result<Self, ServerError> {
        let mut keys = Vec::new();
        for (i, key) in config.api_keys.iter().enumerate() {
            keys.push(checked_key(
                key,
                &format!("server.api_keys[{i}] (or --api-key)"),
            )?);
        }
        if let Some(key) = env_key.filter(|k| !k.is_empty()) {
            keys.push(checked_key(key, "TANDEM_API_KEY")?);
        }
        if !config.api_keys_file.is_empty() {
            let path = &config.api_keys_file;
            let text = std::fs::read_to_string(path).map_err(|e| {
                bad_key("server.api_keys_file", &format!("cannot read {path}: {e}"))
            })?;
            let before = keys.len();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                keys.push(checked_key(
                    line,
                    &format!("server.api_keys_file {path} line {}", n + 1),
                )?);
            }
            if keys.len() == before {
                return Err(bad_key(
                    "server.api_keys_file",
                    &format!("{path} holds no key"),
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        keys.retain(|k| seen.insert(k.clone()));
        Ok(Self { keys })
    }

    #[cfg(test)]
    pub(crate) fn of(keys: &[&str]) -> Self {
        Self {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    /// Whether the inference API needs a key.
    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn count(&self) -> usize {
        self.keys.len()
    }

    /// The tenant of a request's `Authorization: Bearer <key>`, or a 401. Every key is
    /// compared, each in time independent of where it differs, so neither which key matched
    /// nor how much of one did shows in the answer's timing.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Tenant, ApiError> {
        if self.keys.is_empty() {
            return Ok(Tenant::OPEN);
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or_else(|| {
                ApiError::unauthorized(
                    "This server needs an API key: send `Authorization: Bearer <key>`.",
                )
            })?;
        let mut found: Option<u32> = None;
        for (i, key) in self.keys.iter().enumerate() {
            if same_secret(given.as_bytes(), key.as_bytes()) {
                found = Some(i as u32);
            }
        }
        found
            .map(|i| Tenant(Some(i)))
            .ok_or_else(|| ApiError::unauthorized("Incorrect API key provided."))
    }
}

fn checked_key(key: &str, source: &str) -> Result<String, ServerError> {
    let key = key.trim();
    if key.is_empty() {
        return Err(bad_key(source, "an API key is empty"));
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad_key(
            source,
            "an API key holds white space or control characters (clients send it in one \
             HTTP header value)",
        ));
    }
    Ok(key.to_string())
}

/// Compares in time independent of where the strings differ.
pub(super) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header value, trimmed. The scheme's name
/// is matched in any case: HTTP auth schemes are case-insensitive (RFC 7235), and clients and
/// proxies send `bearer` too.
pub(super) fn bearer_token(value: &str) -> Option<&str> {
    const SCHEME: &str = "Bearer ";
    let scheme = value.get(..SCHEME.len())?;
    scheme
        .eq_ignore_ascii_case(SCHEME)
        .then(|| value[SCHEME.len()..].trim())
}

/// Whether `host` (a `server.host` value) only reaches this machine.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

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

    #[test]
    fn each_key_is_its_own_tenant_and_anything_else_is_refused() {
        let keys = ApiKeys::of(&["key-one", "key-two"]);
        let one = keys.identify(&with_auth("Bearer key-one")).unwrap();
        let two = keys.identify(&with_auth("bearer key-two")).unwrap();
        assert_ne!(one, two);
        assert_ne!(one, Tenant::OPEN);
        for bad in [
            "Bearer key-thre",
            "Bearer key-one2",
            "Basic key-one",
            "Bearer ",
        ] {
            let e = keys.identify(&with_auth(bad)).unwrap_err();
            assert_eq!(e.status, 401, "{bad}");
            assert_eq!(e.code, Some("invalid_api_key"));
            assert!(!e.message.contains("key-one"), "{}", e.message);
        }
        assert_eq!(keys.identify(&HeaderMap::new()).unwrap_err().status, 401);
        assert_eq!(
            ApiKeys::default().identify(&HeaderMap::new()).unwrap(),
            Tenant::OPEN
        );
    }

    fn config(keys: &[&str], file: &str) -> ServerConfig {
        let mut c = crate::config::Config::embedded().server;
        c.api_keys = keys.iter().map(|k| k.to_string()).collect();
        c.api_keys_file = file.to_string();
        c
    }

    #[test]
    fn keys_come_from_the_config_the_environment_and_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "# team keys\nfile-key-1\n\n  file-key-2  \nkey-a\n").unwrap();
        let keys = ApiKeys::gather(
            &config(&["key-a", " key-b "], file.to_str().unwrap()),
            Some("env-key"),
        )
        .unwrap();
        assert_eq!(
            keys.keys,
            ["key-a", "key-b", "env-key", "file-key-1", "file-key-2"]
        );
        assert!(!format!("{keys:?}").contains("key-a"), "Debug shows no key");
        let none = ApiKeys::gather(&config(&[], ""), Some("")).unwrap();
        assert!(!none.required());
    }

    #[test]
    fn a_bad_key_or_file_stops_start_up_naming_where() {
        let err =
            |c: ServerConfig, env: Option<&str>| ApiKeys::gather(&c, env).unwrap_err().to_string();
        assert!(err(config(&["ok-key", "  "], ""), None).contains("server.api_keys[1]"));
        assert!(err(config(&["two words"], ""), None).contains("white space"));
        assert!(err(config(&[], ""), Some("a\tb")).contains("TANDEM_API_KEY"));
        let missing = err(config(&[], "/nonexistent/keys"), None);
        assert!(missing.contains("server.api_keys_file"), "{missing}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("keys");
        std::fs::write(&empty, "# nothing yet\n\n").unwrap();
        assert!(err(config(&[], empty.to_str().unwrap()), None).contains("holds no key"));
    }

    #[test]
    fn loopback_hosts_are_told_apart() {
        for host in ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "::", "10.0.0.5", "example.internal"] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
