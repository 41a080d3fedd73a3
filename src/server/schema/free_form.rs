//! Bounds on the free-form fields a request may carry without changing the answer
//! (`metadata`, `user` and the Responses API's identifiers), checked by every endpoint.
//!
//! Why it exists: these fields are kept with a stored response and echoed back, so each one is
//! bounded before anything keeps it (OpenAI's limits), and has its type checked rather than
//! being accepted as anything and ignored.

use serde_json::{Map, Value};

use crate::server::error::ApiError;

/// OpenAI's limits on `metadata`: pairs, then characters of a key and of a value.
pub const METADATA_PAIRS: usize = 16;
pub const METADATA_KEY_CHARS: usize = 64;
pub const METADATA_VALUE_CHARS: usize = 512;

/// The identifier fields, each a string of at most this many characters (`safety_identifier`:
/// OpenAI's 64; the others tandem's own bound).
pub const IDENTIFIERS: [(&str, usize); 4] = [
    ("user", 256),
    ("safety_identifier", 64),
    ("prompt_cache_key", 256),
    ("service_tier", 64),
];

/// `metadata`: an object of at most 16 string pairs, keys of at most 64 characters and values
/// of at most 512.
pub fn check_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let map = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "metadata",
                "`metadata` must be an object of string values.",
            ))
        }
    };
    if map.len() > METADATA_PAIRS {
        return Err(ApiError::invalid_param(
            "metadata",
            format!(
                "`metadata` may hold at most {METADATA_PAIRS} pairs; it holds {}.",
                map.len()
            ),
        ));
    }
    for (key, value) in map {
        if key.chars().count() > METADATA_KEY_CHARS {
            return Err(ApiError::invalid_param(
                "metadata",
                format!("`metadata` keys may be at most {METADATA_KEY_CHARS} characters long."),
            ));
        }
        let Value::String(value) = value else {
            return Err(ApiError::invalid_param(
                "metadata",
                "`metadata` values must be strings.",
            ));
        };
        if value.chars().count() > METADATA_VALUE_CHARS {
            return Err(ApiError::invalid_param(
                "metadata",
                format!("`metadata` values may be at most {METADATA_VALUE_CHARS} characters long."),
            ));
        }
    }
    Ok(())
}

/// `metadata` and the identifier fields of a request body.
pub fn check_free_form(body: &Map<String, Value>) -> Result<(), ApiError> {
    check_metadata(body.get("metadata"))?;
    for (field, max) in IDENTIFIERS {
        match body.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.chars().count() <= max => {}
            Some(Value::String(_)) => {
                return Err(ApiError::invalid_param(
                    field,
                    format!("`{field}` may be at most {max} characters long."),
                ))
            }
            Some(_) => {
                return Err(ApiError::invalid_param(
                    field,
                    format!("`{field}` must be a string."),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn metadata_is_bounded_at_openais_limits() {
        let pairs = |n: usize| {
            Value::Object(
                (0..n)
                    .map(|i| (format!("k{i}"), json!("v")))
                    .collect::<Map<_, _>>(),
            )
        };
        assert!(check_metadata(Some(&pairs(16))).is_ok());
        let e = check_metadata(Some(&pairs(17))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("metadata"));
        assert!(e.message.contains("16"), "{}", e.message);
        let long_key = json!({ "k".repeat(65): "v" });
        assert!(check_metadata(Some(&long_key)).is_err());
        assert!(check_metadata(Some(&json!({ "k".repeat(64): "é".repeat(512) }))).is_ok());
        assert!(check_metadata(Some(&json!({"k": "v".repeat(513)}))).is_err());
        assert!(check_metadata(Some(&json!({"k": 1}))).is_err());
        assert!(check_metadata(Some(&json!({"k": {"nested": "v"}}))).is_err());
        assert!(check_metadata(Some(&json!(["k", "v"]))).is_err());
        assert!(check_metadata(Some(&Value::Null)).is_ok());
    }

    #[test]
    fn identifiers_are_strings_of_bounded_length() {
        assert!(check_free_form(&body(json!({"user": "u-1", "safety_identifier": "s"}))).is_ok());
        let e = check_free_form(&body(json!({"user": "u".repeat(257)}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("user"));
        let e = check_free_form(&body(json!({"safety_identifier": "s".repeat(65)}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("safety_identifier"));
        let e = check_free_form(&body(json!({"prompt_cache_key": {"a": 1}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt_cache_key"));
        let e = check_free_form(&body(json!({"metadata": {"a": 2}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("metadata"));
    }
}
