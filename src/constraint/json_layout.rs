//! How JSON is laid out under `json_object`, a schema or tools: the whitespace the grammar
//! allows between JSON's tokens.
//!
//! Why it exists: a model writes JSON as it learned to (`{\n  "name": "Ava",\n  "age": 20`).
//! A grammar that forbids that layout pushes it off its own distribution, and a small model's
//! answer then degrades (wrong keys, strings that never end). So by default the grammar allows
//! whitespace as llama.cpp's JSON grammar bounds it: between tokens a space, or a newline and
//! up to 20 spaces or tabs. Compact (one line, `, ` and `: `, every separator forced, so they
//! cost no forward steps) is the operator's or the request's choice.

use std::str::FromStr;

use serde_json::{json, Value};

/// Whitespace the grammar allows between a JSON value's tokens.
pub const FLEXIBLE_WHITESPACE: &str = r"(?:\x20|\r?\n[\x20\t]{0,20})";

/// The JSON layout a constraint allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum JsonWhitespace {
    /// [`FLEXIBLE_WHITESPACE`] between tokens.
    #[default]
    Flexible,
    /// One line, `, ` between items and `: ` after keys, nothing else.
    Compact,
    /// Whitespace matching this regex between tokens (vLLM's `guided_whitespace_pattern`).
    Pattern(String),
}

impl FromStr for JsonWhitespace {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "flexible" => Ok(Self::Flexible),
            "compact" => Ok(Self::Compact),
            other => Err(format!("must be flexible or compact, got `{other}`")),
        }
    }
}

impl JsonWhitespace {
    /// llguidance's layout options (`x-guidance`).
    fn options(&self) -> Value {
        let pattern = match self {
            Self::Compact => {
                return json!({
                    "whitespace_flexible": false,
                    "item_separator": ", ",
                    "key_separator": ": ",
                })
            }
            Self::Flexible => FLEXIBLE_WHITESPACE,
            Self::Pattern(p) => p.as_str(),
        };
        json!({
            "whitespace_flexible": true,
            "whitespace_pattern": pattern,
            "item_separator": ",",
            "key_separator": ":",
        })
    }
}

/// `schema` with this layout, unless it sets its own (`x-guidance`).
pub fn with_json_layout(schema: &Value, whitespace: &JsonWhitespace) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| whitespace.options());
    }
    schema
}
