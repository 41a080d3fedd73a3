//! The constraint layer's errors.

#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    #[error("cannot build the constraint vocabulary: {0}")]
    Vocabulary(String),
    /// The grammar or schema does not compile (a malformed schema, an unsupported keyword,
    /// a syntax error); llguidance's own words.
    #[error("{0}")]
    Grammar(String),
    /// The constraint is past one of the bounds of `limits` (or of llguidance's own, met while
    /// compiling): refused before it can hurt the server.
    #[error("the constraint is too complex: {0}")]
    TooComplex(String),
    /// Following the grammar needed more work than llguidance's per-token limits allow (a
    /// grammar that compiled but branches too widely at this point of the output).
    #[error("the grammar became too complex to follow at this point of the output: {0}")]
    Exhausted(String),
    #[error("the constraint can never be satisfied: no token is allowed at the start")]
    Unsatisfiable,
    /// The matcher refused a token the engine emitted under its own mask (a bug, not the
    /// client's).
    #[error("the constraint's matcher failed: {0}")]
    Matcher(String),
}
