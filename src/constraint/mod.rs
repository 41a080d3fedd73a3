//! Structured outputs: a request's output held to a JSON schema, a regular expression, a list
//! of choices or a Lark grammar, through llguidance (the constraint engine llama.cpp, vLLM,
//! SGLang and mistral.rs use).
//!
//! Why it exists: the grammar decides, before the model runs, which tokens may come next. The
//! engine masks the target's logits with that set at every position (plain steps and every
//! verified row alike, so speculation stays exact), cuts drafts at the first token the grammar
//! forbids, and proposes the tokens the grammar forces (a JSON key, `": "`, a closing brace) as
//! drafts of their own, verified by the same rule as every other draft. Compiling happens once
//! per request, before it is queued, on the compile threads of `compiler` and within the
//! bounds of `limits`, so a bad, unsatisfiable or hostile grammar is a 400 before any token is
//! generated and never reaches the async runtime's stack.

mod compiled;
mod compiler;
mod error;
mod json_layout;
pub mod limits;
mod mask;
mod reasons;
mod sequence;
mod spec;
pub mod tools;
mod vocabulary;

pub use compiled::CompiledConstraint;
pub use compiler::{CompilePool, CompilePoolError, CompileResult};
pub use error::ConstraintError;
pub use json_layout::{with_json_layout, JsonWhitespace, FLEXIBLE_WHITESPACE};
pub use mask::TokenMask;
pub use sequence::SequenceConstraint;
pub use spec::{lark_string, ConstraintSpec};
pub use vocabulary::ConstraintVocabulary;
