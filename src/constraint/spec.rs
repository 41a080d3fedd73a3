//! What a request constrains its output to, compiled against the model's vocabulary.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::{json, Value};

use super::{ConstraintError, ConstraintVocabulary, SequenceConstraint};

/// A request's constraint, as the API layer read it.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this schema.
    JsonSchema(Value),
    /// Text matching a regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (which also embeds JSON schemas with `%json`).
    Lark(String),
}

/// How JSON is laid out under a schema unless the schema says otherwise (`x-guidance`):
/// single-line separators and no free whitespace, so a small model cannot wander into endless
/// newlines, and the grammar forces every separator (forced tokens are drafts for free).
fn json_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// A schema with tandem's JSON layout, unless it sets its own.
pub fn with_json_layout(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_layout);
    }
    schema
}

impl ConstraintSpec {
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_layout(&json!({"type": "object"})))
            }
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_json_layout(schema)),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Choice(options) => {
                let alternatives: Vec<String> = options.iter().map(|o| lark_string(o)).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::JsonSchema(_) => "json_schema",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "grammar",
        }
    }
}

/// A Lark string literal for `s`, exactly (JSON's escapes are Lark's).
pub fn lark_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A request's compiled constraint: each sequence of the request (each of its `n` choices)
/// starts its own matcher from it.
#[derive(Clone)]
pub struct CompiledConstraint {
    template: Arc<Matcher>,
    vocab: usize,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint").finish_non_exhaustive()
    }
}

impl ConstraintVocabulary {
    /// Compiles `spec`; refuses a grammar that does not compile or allows no token at all.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<CompiledConstraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|e| ConstraintError::Grammar(first_line(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Grammar(first_line(&e)));
        }
        let start = matcher
            .compute_mask()
            .map_err(|e| ConstraintError::Grammar(first_line(&e.to_string())))?;
        if start.is_zero() {
            return Err(ConstraintError::Unsatisfiable);
        }
        probe_forced_start(&matcher)?;
        Ok(CompiledConstraint {
            template: Arc::new(matcher),
            vocab: self.vocab,
        })
    }
}

/// The most tokens a grammar may force from its start before the first choice.
const MAX_FORCED_START: usize = 4096;

/// Follows the tokens the grammar forces from its start (on a copy): a grammar that forces
/// text without end (a rule that only recurses, say) or grows too complex to run on its way
/// is refused now, rather than failing at its first tokens.
fn probe_forced_start(matcher: &Matcher) -> Result<(), ConstraintError> {
    let mut probe = matcher.deep_clone();
    let mut forced = 0;
    while !probe.is_stopped() {
        let ff = probe.compute_ff_tokens();
        if let Some(e) = probe.get_error() {
            return Err(ConstraintError::Grammar(first_line(&e)));
        }
        if ff.is_empty() {
            return Ok(());
        }
        forced += ff.len();
        if forced > MAX_FORCED_START {
            return Err(ConstraintError::Grammar(format!(
                "the grammar forces more than {MAX_FORCED_START} tokens from its start without \
                 a choice or an end"
            )));
        }
        probe
            .consume_tokens(&ff)
            .map_err(|e| ConstraintError::Grammar(first_line(&e.to_string())))?;
    }
    Ok(())
}

/// llguidance's errors can carry the whole grammar after the first line; a client needs the
/// reason.
pub(super) fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or(e).trim().to_string()
}

impl CompiledConstraint {
    /// A fresh matcher at the start of the output.
    pub fn start(&self) -> SequenceConstraint {
        SequenceConstraint::new(self.template.deep_clone(), self.vocab)
    }
}
