//! The structured-output fields of a request, read into the one constraint it asks for:
//! OpenAI's `response_format`, vLLM's `guided_json`, `guided_regex`, `guided_choice` and
//! `guided_grammar` (Lark), llama.cpp's `json_schema`; and the constraint compiled against the
//! model's vocabulary, so a schema or grammar that cannot work is a 400 naming its field
//! before the request is queued.

use serde_json::Value;

use super::error::ApiError;
use super::schema::CommonParams;
use crate::constraint::{
    CompilePool, CompilePoolError, CompiledConstraint, ConstraintError, ConstraintSpec,
    JsonWhitespace,
};

/// The constraint a request's own fields ask for, with the field that asked; `None` when
/// none does (or `response_format` is `text`). More than one is a 400 naming the second.
pub(super) fn requested_constraint(
    p: &CommonParams,
    whitespace: &JsonWhitespace,
) -> Result<Option<(&'static str, ConstraintSpec)>, ApiError> {
    if p.grammar.is_some() {
        return Err(ApiError::invalid_param(
            "grammar",
            "GBNF grammars are not supported (the constraint engine, llguidance, reads Lark); \
             send the grammar in Lark syntax as `guided_grammar`, or a JSON schema as \
             `response_format`.",
        ));
    }
    let mut found: Vec<(&'static str, ConstraintSpec)> = Vec::new();
    if let Some(rf) = &p.response_format {
        if let Some(spec) = response_format(rf, whitespace)? {
            found.push(("response_format", spec));
        }
    }
    if let Some(v) = &p.guided_json {
        found.push((
            "guided_json",
            ConstraintSpec::JsonSchema(schema_value("guided_json", v)?, whitespace.clone()),
        ));
    }
    if let Some(v) = &p.json_schema {
        found.push((
            "json_schema",
            ConstraintSpec::JsonSchema(schema_value("json_schema", v)?, whitespace.clone()),
        ));
    }
    if let Some(rx) = &p.guided_regex {
        if rx.is_empty() {
            return Err(ApiError::invalid_param(
                "guided_regex",
                "guided_regex must not be empty.",
            ));
        }
        found.push(("guided_regex", ConstraintSpec::Regex(rx.clone())));
    }
    if let Some(choices) = &p.guided_choice {
        if choices.is_empty() || choices.iter().any(String::is_empty) {
            return Err(ApiError::invalid_param(
                "guided_choice",
                "guided_choice must list at least one choice, none of them empty.",
            ));
        }
        found.push(("guided_choice", ConstraintSpec::Choice(choices.clone())));
    }
    if let Some(g) = &p.guided_grammar {
        if g.trim().is_empty() {
            return Err(ApiError::invalid_param(
                "guided_grammar",
                "guided_grammar must not be empty.",
            ));
        }
        found.push(("guided_grammar", ConstraintSpec::Lark(g.clone())));
    }
    if found.len() > 1 {
        return Err(ApiError::invalid_param(
            found[1].0,
            format!(
                "A request takes one structured-output constraint; `{}` and `{}` were both given.",
                found[0].0, found[1].0
            ),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `text`, `json_object` or `json_schema`.
fn response_format(
    rf: &Value,
    whitespace: &JsonWhitespace,
) -> Result<Option<ConstraintSpec>, ApiError> {
    let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid_param(
            "response_format.type",
            "response_format needs a `type`: text, json_object or json_schema.",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject(whitespace.clone()))),
        "json_schema" => {
            let js = rf
                .get("json_schema")
                .filter(|v| v.is_object())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "response_format.json_schema",
                        "response_format of type json_schema needs a `json_schema` object with \
                     the `schema`.",
                    )
                })?;
            if let Some(strict) = js.get("strict") {
                if !strict.is_boolean() && !strict.is_null() {
                    return Err(ApiError::invalid_param(
                        "response_format.json_schema.strict",
                        "strict must be true or false.",
                    ));
                }
            }
            // Without `strict`, the schema is still honoured in full: there is no looser mode.
            let schema = js.get("schema").ok_or_else(|| {
                ApiError::invalid_param(
                    "response_format.json_schema.schema",
                    "response_format.json_schema needs the `schema` itself.",
                )
            })?;
            Ok(Some(ConstraintSpec::JsonSchema(
                schema_value("response_format.json_schema.schema", schema)?,
                whitespace.clone(),
            )))
        }
        other => Err(ApiError::invalid_param(
            "response_format.type",
            format!(
                "Unknown response_format type `{other}`: use text, json_object or json_schema."
            ),
        )),
    }
}

/// A schema given as an object (or, as vLLM also takes it, a JSON string holding one).
fn schema_value(field: &str, v: &Value) -> Result<Value, ApiError> {
    let schema = match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid_param(field, format!("{field} is not valid JSON: {e}"))
        })?,
        other => other.clone(),
    };
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(ApiError::invalid_param(
            field,
            format!("{field} must be a JSON schema (an object)."),
        ));
    }
    Ok(schema)
}

/// The JSON layout a request asks for: vLLM's `guided_whitespace_pattern` (a regex of the
/// whitespace allowed between tokens; "" for none), else the server's default.
pub(super) fn json_whitespace(
    p: &CommonParams,
    default: &JsonWhitespace,
) -> Result<JsonWhitespace, ApiError> {
    match &p.guided_whitespace_pattern {
        None => Ok(default.clone()),
        Some(pattern) if pattern.len() > 1024 => Err(ApiError::invalid_param(
            "guided_whitespace_pattern",
            "guided_whitespace_pattern is at most 1024 bytes.",
        )),
        Some(pattern) if pattern.is_empty() => Ok(JsonWhitespace::Compact),
        Some(pattern) => {
            crate::constraint::limits::check_regex(pattern).map_err(|e| {
                crate::telemetry::record_constraint_too_complex("limits");
                too_complex(
                    "guided_whitespace_pattern",
                    format!("Invalid guided_whitespace_pattern: {e}."),
                )
            })?;
            Ok(JsonWhitespace::Pattern(pattern.clone()))
        }
    }
}

/// Compiles a constraint on the compile threads, as a 400 naming `field` when it cannot work
/// (code `grammar_too_complex` when it is past a limit or its compile outlasts the deadline),
/// or a 503 when every compile thread is taken.
pub(super) async fn compile(
    compiler: Option<&Compiler>,
    field: &str,
    spec: ConstraintSpec,
) -> Result<CompiledConstraint, ApiError> {
    let Some(compiler) = compiler else {
        return Err(ApiError::invalid_param(
            field,
            "This model cannot run structured outputs: it has no end-of-sequence token.",
        ));
    };
    let answer = compiler.pool.submit(spec).map_err(|e| match e {
        CompilePoolError::Full { .. } => ApiError::unavailable(format!(
            "The server is compiling as many constraints as it may ({e}); retry shortly."
        )),
        CompilePoolError::Stopped => ApiError::internal(format!("{e}.")),
    })?;
    let compiled = match tokio::time::timeout(compiler.timeout, answer).await {
        Err(_) => {
            crate::telemetry::record_constraint_too_complex("timeout");
            return Err(too_complex(
                field,
                format!(
                    "The {field} did not compile within {} ms (structured.compile_timeout_ms); \
                     simplify it.",
                    compiler.timeout.as_millis()
                ),
            ));
        }
        Ok(Err(_)) => return Err(ApiError::internal("A constraint compile thread stopped.")),
        Ok(Ok(compiled)) => compiled,
    };
    compiled.map_err(|e| match e {
        ConstraintError::Unsatisfiable => ApiError::invalid_param(
            field,
            format!("The {field} can never be satisfied: no output matches it."),
        ),
        e @ (ConstraintError::TooComplex(_) | ConstraintError::Exhausted(_)) => {
            crate::telemetry::record_constraint_too_complex("limits");
            too_complex(field, format!("Invalid {field}: {e}."))
        }
        other => ApiError::invalid_param(field, format!("Invalid {field}: {other}")),
    })
}

/// A 400 naming `field`, with the code a client can act on.
pub(super) fn too_complex(field: &str, message: String) -> ApiError {
    let mut e = ApiError::invalid_param(field, message);
    e.code = Some(crate::engine::GRAMMAR_TOO_COMPLEX);
    e
}

/// Where a server compiles its requests' constraints, and how long a compile may take.
pub struct Compiler {
    pub pool: CompilePool,
    pub timeout: std::time::Duration,
    /// JSON's layout when a request does not choose one.
    pub json_whitespace: JsonWhitespace,
}
