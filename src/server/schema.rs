//! OpenAI request bodies, parsed strictly enough to refuse what we cannot honour.
//!
//! Why it exists: the wire format is the contract with every OpenAI client, so it lives apart
//! from the handlers. Fields we do not know are ignored (clients send many, such as `user` or
//! `metadata`, that change nothing in the answer), but a field of OpenAI's or vLLM's APIs that
//! would change the answer and that tandem does not do (`functions`, `suffix`), a known field
//! of the wrong type, or a value we do not support (`best_of` above `n`) is a 400 naming it.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::ApiError;

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
    // `expected struct SpeculationOverride`: the type's name means nothing to a client.
    while let Some(at) = out.find("expected struct ") {
        let name_start = at + "expected struct ".len();
        let name_end = out[name_start..]
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .map_or(out.len(), |e| name_start + e);
        out.replace_range(at..name_end, "expected an object");
    }
    out
}

/// `prompt`: one string, one string in an array, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

impl StopInput {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Sampling and control fields shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens` (both endpoints take it, as vLLM does).
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub seed: Option<u64>,
    pub stop: Option<StopInput>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    pub best_of: Option<usize>,
    pub echo: Option<bool>,
    /// Completions: how many alternatives (an integer); chat: whether to report (a boolean).
    pub logprobs: Option<serde_json::Value>,
    /// Chat: how many alternatives with `logprobs: true`.
    pub top_logprobs: Option<usize>,
    /// The `speculative` extension: the request's own speculation settings.
    pub speculative: Option<crate::engine::SpeculationOverride>,
    /// vLLM's extension: keep going past end-of-sequence tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// Structured outputs (`structured.rs`): OpenAI's field, then vLLM's and llama.cpp's.
    pub response_format: Option<serde_json::Value>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub json_schema: Option<serde_json::Value>,
    /// vLLM's: the whitespace JSON may hold between tokens, as a regex ("" for none).
    pub guided_whitespace_pattern: Option<String>,
    /// llama.cpp's GBNF grammar: refused with the field to use instead.
    pub grammar: Option<serde_json::Value>,
}

/// The most alternatives a token's logprobs may list (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl CommonParams {
    /// Chat's `logprobs` (a boolean) and `top_logprobs`.
    pub fn chat_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = match &self.logprobs {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "On chat completions `logprobs` is true or false; ask for alternatives \
                     with `top_logprobs`.",
                ))
            }
        };
        match self.top_logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}."),
            )),
            Some(n) if n > 0 && !on => Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs needs `logprobs: true`.",
            )),
            top => Ok(on.then_some(top.unwrap_or(0))),
        }
    }

    /// The completions API's `logprobs` (an integer, the number of alternatives).
    pub fn completion_logprobs(&self) -> Result<Option<usize>, ApiError> {
        if self.top_logprobs.is_some() {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs belongs to chat completions; here `logprobs` is the number of \
                 alternatives.",
            ));
        }
        let bad = || {
            ApiError::invalid_param(
                "logprobs",
                format!("logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}."),
            )
        };
        match &self.logprobs {
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => Ok(None),
            Some(serde_json::Value::Number(n)) => match n.as_u64() {
                Some(k) if k as usize <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
        }
    }

    /// `n` and `best_of`: how many choices, at most `limit`.
    pub fn choices(&self, limit: usize) -> Result<usize, ApiError> {
        let n = self.n.unwrap_or(1);
        if n == 0 || n > limit {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be between 1 and {limit} (this server's engine.max_seqs)."),
            ));
        }
        if self.best_of.is_some_and(|b| b != n) {
            return Err(ApiError::invalid_param(
                "best_of",
                "best_of must equal n: every choice generated is returned.",
            ));
        }
        Ok(n)
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Option<PromptInput>,
}

impl EndpointFields for CompletionRequest {
    const FIELDS: &'static [&'static str] = &["prompt"];
}

/// A message's content: a string or OpenAI's list of parts (text parts only).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Option<MessageContent>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A tool turn: the call it answers (results reach the model in the order of the calls).
    pub tool_call_id: Option<String>,
    /// The speaker's name, handed to the chat template as `name`.
    pub name: Option<String>,
}

/// A tool call of an earlier assistant turn, as the client sends it back.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    /// What a later tool turn's `tool_call_id` names.
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// The arguments as a JSON string (OpenAI's shape); an object is taken too.
    pub arguments: serde_json::Value,
}

/// One entry of `tools`.
#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionIn>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Option<Vec<ChatMessageIn>>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
}

impl EndpointFields for ChatRequest {
    const FIELDS: &'static [&'static str] =
        &["messages", "tools", "tool_choice", "parallel_tool_calls"];
}

impl MessageContent {
    /// The text, or why the content cannot be used.
    pub fn into_text(self, index: usize) -> Result<String, ApiError> {
        match self {
            Self::Text(s) => Ok(s),
            Self::Parts(parts) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                &format!("messages[{index}].content"),
                                format!(
                                    "Content parts of type `{kind}` are not supported; only text."
                                ),
                            ))
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tandem_does_not_do_are_refused_by_name() {
        for field in ["functions", "suffix", "structured_outputs"] {
            let body = format!(r#"{{"prompt":"hi","{field}":{{"a":1}}}}"#);
            let e = parse_request::<CompletionRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
        }
        // Fields that change nothing in the answer pass, and so does an explicit null.
        parse_request::<CompletionRequest>(br#"{"prompt":"hi","user":"u","suffix":null}"#).unwrap();
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse_request::<CompletionRequest>(br#"{"prompt":"hi","temperature":"hot"}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        let e = parse_request::<ChatRequest>(br#"{"messages":[{"role":"user","content":5}]}"#)
            .unwrap_err();
        assert!(e.param.unwrap().starts_with("messages"));
        let e = parse_request::<CompletionRequest>(br#"{"prompt": "hi", "#).unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse_request::<CompletionRequest>(b"  ").unwrap_err();
        assert!(e.message.contains("empty"), "{}", e.message);
        let e = parse_request::<CompletionRequest>(b"[1]").unwrap_err();
        assert!(e.message.contains("object"), "{}", e.message);
        let e = parse_request::<CompletionRequest>(br#"{"prompt":"x","speculative":{"gama":2}}"#)
            .unwrap_err();
        assert!(e.message.contains("gama"), "{}", e.message);
    }

    #[test]
    fn speculative_takes_an_object_and_says_so() {
        for bad in ["[1]", "[true]", "true", "3", r#""fast""#] {
            let body = format!(r#"{{"prompt":"x","speculative":{bad}}}"#);
            let e = parse_request::<CompletionRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(
                e.param.as_deref(),
                Some("speculative"),
                "{bad}: {}",
                e.message
            );
            assert!(
                e.message
                    .contains("expected an object of speculation settings, such as"),
                "{bad}: {}",
                e.message
            );
            assert!(
                !e.message.contains("expected a boolean"),
                "{bad}: {}",
                e.message
            );
        }
        let e =
            parse_request::<CompletionRequest>(br#"{"prompt":"x","speculative":[1]}"#).unwrap_err();
        assert!(e.message.contains("invalid type: array"), "{}", e.message);
        let (_, c): (CompletionRequest, _) =
            parse_request(br#"{"prompt":"x","speculative":{"enabled":false,"lenience":0.9}}"#)
                .unwrap();
        let s = c.speculative.unwrap();
        assert_eq!((s.enabled, s.lenience), (Some(false), Some(0.9)));
        let (_, c): (CompletionRequest, _) =
            parse_request(br#"{"prompt":"x","speculative":null}"#).unwrap();
        assert!(c.speculative.is_none());
    }

    #[test]
    fn prompts_and_stops_take_every_openai_shape() {
        let (r, c): (CompletionRequest, _) =
            parse_request(br#"{"prompt":["a"],"stop":"x","n":1,"logprobs":null}"#).unwrap();
        assert!(matches!(r.prompt, Some(PromptInput::Texts(ref v)) if v.len() == 1));
        assert_eq!(c.stop.unwrap().to_vec(), vec!["x"]);
        let (r, _): (CompletionRequest, _) =
            parse_request(br#"{"prompt":[1,2,3],"stop":["a","b"]}"#).unwrap();
        assert!(matches!(r.prompt, Some(PromptInput::Tokens(ref v)) if v == &[1, 2, 3]));
        let (_, c): (CompletionRequest, _) = parse_request(br#"{"prompt":"x","n":9}"#).unwrap();
        assert_eq!(c.choices(8).unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(c.choices(9).unwrap(), 9);
        let (_, c): (ChatRequest, _) = parse_request(
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":false}"#,
        )
        .unwrap();
        assert_eq!(c.chat_logprobs().unwrap(), None);
    }

    #[test]
    fn logprobs_take_each_endpoints_shape() {
        let chat = |body: &str| {
            let (_, c): (ChatRequest, _) = parse_request(body.as_bytes()).unwrap();
            c.chat_logprobs()
        };
        assert_eq!(chat(r#"{"logprobs":true}"#).unwrap(), Some(0));
        assert_eq!(
            chat(r#"{"logprobs":true,"top_logprobs":5}"#).unwrap(),
            Some(5)
        );
        for bad in [
            r#"{"logprobs":3}"#,
            r#"{"top_logprobs":2}"#,
            r#"{"logprobs":true,"top_logprobs":21}"#,
        ] {
            assert!(chat(bad).is_err(), "{bad}");
        }
        let completion = |body: &str| {
            let (_, c): (CompletionRequest, _) = parse_request(body.as_bytes()).unwrap();
            c.completion_logprobs()
        };
        assert_eq!(completion(r#"{"logprobs":0}"#).unwrap(), Some(0));
        assert_eq!(completion(r#"{"logprobs":20}"#).unwrap(), Some(20));
        assert_eq!(completion(r#"{"logprobs":null}"#).unwrap(), None);
        for bad in [
            r#"{"logprobs":21}"#,
            r#"{"logprobs":true}"#,
            r#"{"logprobs":-1}"#,
            r#"{"logprobs":2,"top_logprobs":2}"#,
        ] {
            assert!(completion(bad).is_err(), "{bad}");
        }
    }
}
