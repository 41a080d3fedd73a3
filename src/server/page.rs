//! The web page at `/`: chat with each token marked by who wrote it, per-message speed and
//! acceptance, and for an operator the live speculation settings and charts.
//!
//! Why it exists: speculation is this server's point, and a page that shows it token by token
//! (and lets an operator move lenience and γ and watch the effect) says more than metrics. The
//! page is one file built into the binary, so it works offline with nothing to install; it
//! talks only to this server's own API, with the API key and admin token the person enters
//! (kept in their browser).

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page: one self-contained HTML file (inline styles and script, no outside requests).
const PAGE: &str = include_str!("../../web/index.html");

/// The page may run only its own inline code and talk only to this origin; no frame may hold
/// it.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}
