//! Reading a request body: JSON, refused fields named, and serde's errors in the API's words.
//!
//! Why it exists: every endpoint reads its body the same way, and a bad field must come back
//! as a 400 naming it rather than as serde's Rust-flavoured message.

use serde::de::DeserializeOwned;

use super::common::CommonParams;
use crate::server::error::ApiError;

/// Parses a JSON body, naming the field whose value has the wrong type.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    from_value(parse_json(bytes)?)
}

/// Fields of OpenAI's or vLLM's APIs that change what a client gets back and that tandem does
/// not do: refused by name rather than ignored.
const REFUSED_FIELDS: [(&str, &str); 11] = [
    (
        "functions",
        "The legacy `functions` field is not supported; send `tools` (and `tool_choice`).",
    ),
    (
        "function_call",
        "The legacy `function_call` field is not supported; send `tool_choice`.",
    ),
    (
        "structured_outputs",
        "Send the constraint as `response_format`, `guided_json`, `guided_regex`, \
         `guided_choice` or `guided_grammar`.",
    ),
    (
        "guided_decoding_backend",
        "The constraint engine is always llguidance; leave `guided_decoding_backend` out.",
    ),
    (
        "tools",
        "Tools belong to /v1/chat/completions; a completion's prompt is the model's whole \
         input.",
    ),
    (
        "tool_choice",
        "tool_choice belongs to /v1/chat/completions, with its `tools`.",
    ),
    (
        "parallel_tool_calls",
        "parallel_tool_calls belongs to /v1/chat/completions, with its `tools`.",
    ),
    ("suffix", "Insertion (`suffix`) is not supported."),
    ("audio", "Only text output is supported."),
    (
        "modalities",
        "Only text output is supported: send `modalities: [\"text\"]` or leave it out.",
    ),
    ("prediction", "Predicted outputs are not supported."),
];

/// Whether a refused field's value asks for exactly what tandem does anyway (OpenAI's own
/// client sends `modalities: ["text"]`, its default): that value is accepted.
fn is_what_we_do(field: &str, v: &serde_json::Value) -> bool {
    field == "modalities" && *v == serde_json::json!(["text"])
}

/// An endpoint's own body fields (the rest are the shared [`CommonParams`]).
pub trait EndpointFields: DeserializeOwned {
    const FIELDS: &'static [&'static str];
}

/// Parses an endpoint's body into its own fields and the shared ones, each field read once:
/// the endpoint's fields are taken out of the object and the rest is the shared part. (Not
/// `#[serde(flatten)]`, which would hide the path of a bad field.)
pub fn parse_request<T: EndpointFields>(bytes: &[u8]) -> Result<(T, CommonParams), ApiError> {
    let serde_json::Value::Object(mut all) = parse_json(bytes)? else {
        return Err(ApiError::invalid("The request body must be a JSON object."));
    };
    let own: serde_json::Map<String, serde_json::Value> = T::FIELDS
        .iter()
        .filter_map(|k| all.remove_entry(*k))
        .collect();
    if let Some((field, why)) = REFUSED_FIELDS.iter().find(|(f, _)| {
        all.get(*f)
            .is_some_and(|v| !v.is_null() && !is_what_we_do(f, v))
    }) {
        return Err(ApiError::invalid_param(field, *why));
    }
    super::free_form::check_free_form(&all)?;
    all.retain(|f, v| !is_what_we_do(f, v));
    Ok((
        from_value(serde_json::Value::Object(own))?,
        from_value(serde_json::Value::Object(all))?,
    ))
}

fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "The request body is empty; send a JSON object.",
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))
}

fn from_value<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = in_plain_words(&e.into_inner().to_string());
        if path == "." || path.is_empty() {
            ApiError::invalid(format!("Invalid request body: {inner}"))
        } else {
            ApiError::invalid_param(&path, format!("Invalid value for `{path}`: {inner}"))
        }
    })
}

/// serde's message about a value of the wrong shape, told in the API's words rather than Rust's:
/// what the field accepts instead of an enum's or an integer type's name.
fn in_plain_words(serde_message: &str) -> String {
    const SHAPES: [(&str, &str); 3] = [
        (
            "untagged enum PromptInput",
            "expected a string, an array of strings, an array of token ids (integers) or an \
             array of such arrays",
        ),
        (
            "untagged enum StopInput",
            "expected a string or an array of strings",
        ),
        (
            "untagged enum MessageContent",
            "expected a string or an array of content parts like {\"type\": \"text\", \"text\": \"...\"}",
        ),
    ];
    if let Some((_, plain)) = SHAPES.iter().find(|(rust, _)| serde_message.contains(rust)) {
        return (*plain).to_string();
    }
    let mut out = serde_message.to_string();
    for (rust, plain) in [
        ("expected usize", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: object"),
    ] {
        out = out.replace(rust, plain);
    }
    // `expected struct SpeculationKnobs`: the type's name means nothing to a client.
    while let Some(at) = out.find("expected struct ") {
        let name_start = at + "expected struct ".len();
        let name_end = out[name_start..]
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .map_or(out.len(), |e| name_start + e);
        out.replace_range(at..name_end, "expected an object");
    }
    out
}
