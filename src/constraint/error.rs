//! The constraint layer's errors.

#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    #[error("cannot build the constraint vocabulary: {0}")]
    Vocabulary(String),
    /// The grammar or schema does not compile (a malformed schema, an unsupported keyword,
    /// a syntax error); llguidance's own words.
    #[error("{0}")]
    Grammar(String),
    #[error("the constraint can never be satisfied: no token is allowed at the start")]
    Unsatisfiable,
    /// The matcher refused a token the engine emitted under its own mask (a bug, not the
    /// client's).
    #[error("the constraint's matcher failed: {0}")]
    Matcher(String),
}
