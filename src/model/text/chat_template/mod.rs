//! Chat templates: turning a list of chat messages into the exact prompt text a model was
//! fine-tuned on.
//!
//! Models ship their prompt format as a Jinja2 template (`tokenizer.chat_template` in GGUF,
//! `chat_template` in Hugging Face's `tokenizer_config.json`). Those templates are written for
//! Python's Jinja2 as used by `transformers`, so rendering them faithfully needs more than plain
//! Jinja: the `trim_blocks`/`lstrip_blocks` whitespace settings `transformers` uses, the helper
//! functions it injects (`raise_exception`, `strftime_now`), a Python-flavoured `tojson`, and the
//! Python `str`/`dict` methods templates call (`.strip()`, `.startswith()`, `.items()`, ...).
//! This module provides exactly that on top of minijinja, without further dependencies.//!
//! `python_methods` holds the Python string and dict methods, `strftime` the date formatting
//! behind `strftime_now`.

use std::fmt;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

mod python_methods;
mod strftime;

use python_methods::python_method;
use strftime::strftime_now;

/// Name under which the single template lives in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The speaker's name (OpenAI's `name`), for templates that write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            name: None,
        }
    }
}

/// Errors of compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source is not valid Jinja; reported once, when the model is loaded.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed, including a template calling `raise_exception` (for example because
    /// the roles do not alternate as the model requires).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` once, so a broken template is reported at load time rather than on
    /// the first request.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        // `transformers` renders chat templates with these two settings; without them the
        // block tags of most templates leave stray newlines and indentation in the prompt.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends with the header
    /// that makes the model answer as the assistant.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        // An absent token stays undefined (renders as "") rather than becoming the string
        // "none", matching `transformers`, which only passes the tokens a model has.
        let token = |t: &Option<String>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => token(&self.bos_token),
            eos_token => token(&self.eos_token),
        };
        template
            .render(ctx)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
}

/// minijinja's `Display` omits the chained cause; templates raising errors and nested
/// failures are much easier to diagnose with it.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Templates call this to reject conversations they cannot format.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}
/// `tojson` as `transformers` defines it: Python `json.dumps` output (", " and ": "
/// separators, optional `indent`), without Jinja's HTML escaping, so tool schemas in a prompt
/// look exactly as they did during fine-tuning.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; Rust strings are written as UTF-8 either way.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            value.serialize(&mut ser)
        }
    };
    result.map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    })?;
    let text = String::from_utf8(out).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "JSON output is not UTF-8").with_source(e)
    })?;
    Ok(Value::from_safe_string(text))
}

/// serde_json formatter reproducing Python's default `json.dumps` separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
