//! The structured workloads of `tandem bench`: each question answered into a JSON schema, or
//! with a call of one of a few tools, compiled once per run against the model's vocabulary.
//!
//! Why it exists: structured outputs are where the grammar forces tokens (keys, separators,
//! braces) that speculation verifies as drafts of their own; these workloads measure that gain
//! and what the constraint itself costs, on the same questions as every other mode.

use serde_json::json;

use super::mode::{Mode, Structured};
use super::BenchError;
use crate::constraint::tools::{Tool, ToolChoice, Tools};
use crate::constraint::{CompiledConstraint, ConstraintSpec, ConstraintVocabulary, JsonWhitespace};

/// The schema a `json` mode answers into: a short topic, up to three keywords, a confidence
/// and the answer itself.
fn answer_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "topic": {"type": "string", "maxLength": 40},
            "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24},
                         "maxItems": 3},
            "confidence": {"enum": ["low", "medium", "high"]},
            "answer": {"type": "string"},
        },
        "required": ["topic", "keywords", "confidence", "answer"],
        "additionalProperties": false,
    })
}

/// The tools a `tools` mode must call one of.
fn tool_set() -> Tools {
    let string = |max: u32| json!({"type": "string", "maxLength": max});
    let object = |props: serde_json::Value, required: &[&str]| {
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    Tools::new(
        vec![
            Tool {
                name: "web_search".into(),
                description: Some("Search the web for pages about a query".into()),
                parameters: object(json!({"query": string(80)}), &["query"]),
            },
            Tool {
                name: "calculate".into(),
                description: Some("Evaluate an arithmetic expression".into()),
                parameters: object(json!({"expression": string(80)}), &["expression"]),
            },
            Tool {
                name: "write_file".into(),
                description: Some("Write text to a file".into()),
                parameters: object(
                    json!({"path": string(40), "text": {"type": "string"},
                           "mode": {"enum": ["create", "append"]}}),
                    &["path", "mode", "text"],
                ),
            },
        ],
        ToolChoice::Required,
        false,
    )
}

/// The compiled constraints a run's modes need.
#[derive(Default)]
pub(super) struct Structures {
    json: Option<CompiledConstraint>,
    tools: Option<(String, CompiledConstraint)>,
    /// The tools' system prompt alone (`tools_prompt`).
    tools_prompt: Option<String>,
}

impl Structures {
    pub fn compile(
        vocab: Option<&ConstraintVocabulary>,
        modes: &[Mode],
        whitespace: &JsonWhitespace,
    ) -> Result<Self, BenchError> {
        let wanted = |s: Structured| modes.iter().any(|m| m.structured == s);
        let tools_prompt = wanted(Structured::ToolsPrompt).then(|| tool_set().system_prompt());
        if !wanted(Structured::Json) && !wanted(Structured::Tools) {
            return Ok(Self {
                tools_prompt,
                ..Self::default()
            });
        }
        let vocab = vocab.ok_or_else(|| {
            BenchError::Options("structured modes need the model's constraint vocabulary".into())
        })?;
        let compile = |spec: &ConstraintSpec| {
            vocab
                .compile(spec)
                .map_err(|e| BenchError::Options(format!("structured workload: {e}")))
        };
        let mut out = Self {
            tools_prompt,
            ..Self::default()
        };
        if wanted(Structured::Json) {
            out.json = Some(compile(&ConstraintSpec::JsonSchema(
                answer_schema(),
                whitespace.clone(),
            ))?);
        }
        if wanted(Structured::Tools) {
            let tools = tool_set();
            let spec = tools
                .constraint(whitespace)
                .expect("required tools constrain the answer");
            out.tools = Some((tools.system_prompt(), compile(&spec)?));
        }
        Ok(out)
    }

    /// A mode's constraint, and the system prompt its questions go with (the tools').
    pub fn of(&self, s: Structured) -> (Option<CompiledConstraint>, Option<&str>) {
        match s {
            Structured::Free => (None, None),
            Structured::Json => (self.json.clone(), None),
            Structured::Tools => match &self.tools {
                Some((prompt, c)) => (Some(c.clone()), Some(prompt.as_str())),
                None => (None, None),
            },
            Structured::ToolsPrompt => (None, self.tools_prompt.as_deref()),
        }
    }
}

/// What a `json` mode's question says besides the question: answer in the schema's shape.
pub(super) const JSON_INSTRUCTION: &str =
    "Answer as a JSON object with a short topic, up to three keywords, your confidence \
     (low, medium or high) and the answer.";
