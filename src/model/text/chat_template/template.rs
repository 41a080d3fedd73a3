//! A chat template compiled once, with the helpers `transformers` gives templates, and rendered
//! per conversation.
//!
//! Why it exists: compiling at load time reports a broken template once, and the environment
//! set up here is what makes a template written for Python's Jinja2 render the same text.

use std::fmt;

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

use super::message::ChatMessage;
use super::python_methods::python_method;
use super::strftime::strftime_now;
use super::tojson::tojson;

/// Name under which the single template lives in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

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
    /// The template ran past its bounds: more than [`RENDER_FUEL`] steps, or a prompt longer
    /// than [`MAX_RENDERED_BYTES`]. A fault of the template, not of the conversation.
    #[error("chat template ran past its bounds: {0}")]
    Exhausted(String),
}

/// Most steps (minijinja's fuel: about one an instruction) one render may take. A real
/// template spends tens of steps a message; this is thousands of times a long conversation's
/// need, and ends a runaway loop within about a second.
pub const RENDER_FUEL: u64 = 20_000_000;

/// Longest prompt text one render may write.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The render's output, refusing to grow past [`MAX_RENDERED_BYTES`].
struct BoundedText {
    text: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The template reads `reasoning_effort` (gpt-oss's writes it into its system header).
    reads_reasoning_effort: bool,
}

/// What a request may hand a template besides the conversation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateOptions {
    /// OpenAI's `reasoning_effort` (`low`, `medium`, `high`), for templates that read it.
    pub reasoning_effort: Option<String>,
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
        // A template is code from a model file: its run is bounded like any input's.
        env.set_fuel(Some(RENDER_FUEL));
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
            reads_reasoning_effort: source.contains("reasoning_effort"),
        })
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends with the header
    /// that makes the model answer as the assistant.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, &TemplateOptions::default())
    }

    /// Whether the template reads `reasoning_effort` (a request's setting would otherwise be
    /// ignored: refuse it instead).
    pub fn reads_reasoning_effort(&self) -> bool {
        self.reads_reasoning_effort
    }

    /// [`Self::render`] with a request's `options` in the template's context.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &TemplateOptions,
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
            reasoning_effort => token(&options.reasoning_effort),
        };
        let mut out = BoundedText {
            text: Vec::new(),
            overflowed: false,
        };
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.text)
                .map_err(|_| ChatTemplateError::Render("the output is not UTF-8".into())),
            Err(_) if out.overflowed => Err(ChatTemplateError::Exhausted(format!(
                "the prompt grew past {MAX_RENDERED_BYTES} bytes"
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ChatTemplateError::Exhausted(
                format!("it took more than {RENDER_FUEL} steps"),
            )),
            Err(e) => Err(ChatTemplateError::Render(describe(&e))),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, content: &str) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(source, None, None)
            .unwrap()
            .render(&[ChatMessage::new("user", content)], true)
    }

    #[test]
    fn a_runaway_loop_runs_out_of_fuel_and_a_flood_of_text_out_of_room() {
        let looping = "{% for i in range(100000) %}{% for j in range(100000) %}\
                       {% if i < 0 %}x{% endif %}{% endfor %}{% endfor %}";
        let e = render(looping, "hi").unwrap_err();
        assert!(
            matches!(&e, ChatTemplateError::Exhausted(why) if why.contains("steps")),
            "{e}"
        );
        let flooding = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
        let e = render(flooding, "hi").unwrap_err();
        assert!(
            matches!(&e, ChatTemplateError::Exhausted(why) if why.contains("bytes")),
            "{e}"
        );
        // An ordinary template over a long conversation stays well inside both.
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}\
                      <|im_end|>\n{% endfor %}<|im_start|>assistant\n";
        let turns: Vec<ChatMessage> = (0..5000)
            .map(|i| ChatMessage::new("user", format!("message {i}")))
            .collect();
        let text = ChatTemplate::new(chatml, None, None)
            .unwrap()
            .render(&turns, true)
            .unwrap();
        assert!(text.contains("message 4999"));
        // A template's own error stays a render error (the conversation's fault).
        let e = render("{{ raise_exception('no') }}", "hi").unwrap_err();
        assert!(matches!(e, ChatTemplateError::Render(_)), "{e}");
    }
}
