//! What a request constrains its output to: a JSON object or schema, a regex, a choice or a
//! Lark grammar, as the grammar llguidance compiles (`compiled.rs`).

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use super::json_layout::{with_json_layout, JsonWhitespace};

/// A request's constraint, as the API layer read it.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`), laid out so.
    JsonObject(JsonWhitespace),
    /// A JSON value valid against this schema, laid out so unless the schema says otherwise.
    JsonSchema(Value, JsonWhitespace),
    /// Text matching a regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (which also embeds JSON schemas with `%json`).
    Lark(String),
}

impl ConstraintSpec {
    pub(super) fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonObject(ws) => {
                TopLevelGrammar::from_json_schema(with_json_layout(&json!({"type": "object"}), ws))
            }
            Self::JsonSchema(schema, ws) => {
                TopLevelGrammar::from_json_schema(with_json_layout(schema, ws))
            }
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Choice(options) => {
                // One terminal, so the choices are one lexeme (a union the lexer follows)
                // rather than one parser item each: a long list stays within the parser's
                // items per row.
                let alternatives: Vec<String> = options.iter().map(|o| lark_string(o)).collect();
                TopLevelGrammar::from_lark(format!(
                    "start: CHOICE\nCHOICE: {}",
                    alternatives.join(" | ")
                ))
            }
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject(_) => "json_object",
            Self::JsonSchema(..) => "json_schema",
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
