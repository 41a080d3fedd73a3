//! Reading a request body within the server's size and time limits.
//!
//! Why it exists: every endpoint that takes a body reads it the same way, and a body too large,
//! too slow or broken off is answered with its own status.

use super::error::ApiError;
use super::AppState;

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
