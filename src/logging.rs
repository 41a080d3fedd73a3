//! Structured logs (`tracing`) for the server: one line per event with key-value fields, as
//! text or JSON, at a level from the config (`[logging]`) or `TANDEM_LOG`.
//!
//! Why it exists: operators grep and ship logs; every request-scoped line carries the request
//! id (the one the client sees in the response's `id` and `x-request-id`), so one request's
//! story can be pulled out of a busy server's log.
//!
//! Logs cannot be forged: user-supplied strings (a model name, a stop string, an error that
//! quotes the request) reach log fields, and a newline in one would start a line of the
//! client's choosing. Every event passes through [`OneLinePerEvent`], which escapes line
//! breaks (U+2028 and U+2029 too, which log viewers and JavaScript break lines at) and other
//! control characters inside it, so one event is always exactly one line.

use std::borrow::Cow;
use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("logging.level: `{0}` is not a valid level or filter ({1})")]
    Filter(String, String),
    #[error("logging.format must be text or json, got `{0}`")]
    Format(String),
    #[error("logging: a subscriber is already installed")]
    AlreadySet,
}

/// Installs the process-wide subscriber, writing to stderr. `filter` is a level (`info`) or an
/// `EnvFilter` directive list (`info,tandem::engine=debug`); `TANDEM_LOG` overrides it.
pub fn init(filter: &str, format: &str) -> Result<(), LoggingError> {
    let filter = std::env::var("TANDEM_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| filter.to_string());
    let env_filter = EnvFilter::try_new(&filter)
        .map_err(|e| LoggingError::Filter(filter.clone(), e.to_string()))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_target(false)
        .with_ansi(false);
    match format {
        "text" => builder
            .with_writer(OneLinePerEvent(LineFormat::Text))
            .try_init(),
        "json" => builder
            .with_writer(OneLinePerEvent(LineFormat::Json))
            .json()
            .flatten_event(true)
            .try_init(),
        other => return Err(LoggingError::Format(other.to_string())),
    }
    .map_err(|_| LoggingError::AlreadySet)
}

/// Checks a `logging` config section without installing anything.
pub fn validate(filter: &str, format: &str) -> Result<(), LoggingError> {
    EnvFilter::try_new(filter)
        .map_err(|e| LoggingError::Filter(filter.to_string(), e.to_string()))?;
    match format {
        "text" | "json" => Ok(()),
        other => Err(LoggingError::Format(other.to_string())),
    }
}

/// How an escaped character is written in a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// As Rust writes it: `\u{2028}`.
    Text,
    /// As a JSON string escape, `\u2028`, so each line still parses, to the client's text:
    /// the formatter escapes only what JSON requires, which leaves U+2028, DEL and the C1
    /// controls raw (they can only be inside strings).
    Json,
}

/// Writes each formatted event to stderr as one line (the formatter hands over a whole event
/// per write), line breaks and control characters inside it escaped.
#[derive(Clone, Copy)]
pub struct OneLinePerEvent(pub LineFormat);

impl<'a> MakeWriter<'a> for OneLinePerEvent {
    type Writer = OneLinePerEvent;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

impl Write for OneLinePerEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr()
            .lock()
            .write_all(one_line(&text, self.0).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Whether `c` must not reach a log line raw: a control character (newline, carriage return,
/// escape sequences, NEL) or a line or paragraph separator (U+2028, U+2029), which are not
/// control characters to Unicode but end a line for log viewers and JavaScript alike.
fn breaks_lines(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// The event as one line: its final newline kept, every other line break or control
/// character written as a visible escape (tabs are kept).
pub fn one_line(event: &str, format: LineFormat) -> Cow<'_, str> {
    let (body, end) = match event.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (event, ""),
    };
    if !body.chars().any(|c| c != '\t' && breaks_lines(c)) {
        return Cow::Borrowed(event);
    }
    let mut out = String::with_capacity(event.len() + 8);
    for c in body.chars() {
        match c {
            '\t' => out.push('\t'),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if breaks_lines(c) => match format {
                LineFormat::Text => out.push_str(&c.escape_unicode().to_string()),
                // Every such character is in the Basic Multilingual Plane: one escape.
                LineFormat::Json => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            },
            c => out.push(c),
        }
    }
    out.push_str(end);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{one_line, LineFormat};

    #[test]
    fn an_event_stays_one_line() {
        let text = |e| one_line(e, LineFormat::Text);
        assert_eq!(text("plain line\n"), "plain line\n");
        let forged = "INFO request refused model=\"x\\n2026 INFO FAKE admin token accepted\"\n";
        let forged = forged.replace("\\n", "\n");
        let out = text(&forged);
        assert_eq!(out.matches('\n').count(), 1, "{out}");
        assert!(out.ends_with('\n'));
        assert!(out.contains("x\\n2026 INFO FAKE"), "{out}");
        assert_eq!(text("a\rb\u{1b}[31mc"), "a\\rb\\u{1b}[31mc");
        assert_eq!(text("tab\tkept\n"), "tab\tkept\n");
        assert_eq!(
            text("a\u{2028}FAKE\u{2029}FAKE\u{85}FAKE\u{b}\u{c}\n"),
            "a\\u{2028}FAKE\\u{2029}FAKE\\u{85}FAKE\\u{b}\\u{c}\n"
        );
        assert_eq!(text("caf\u{e9} \u{2603}"), "caf\u{e9} \u{2603}");
    }

    #[test]
    fn a_json_event_stays_one_line_of_json_with_the_clients_text() {
        let sent = "x\u{2028}FAKE\u{2029}FAKE\u{7f}\u{85}\u{1b}\n\t";
        let event = format!("{}\n", serde_json::json!({ "model": sent }));
        let out = one_line(&event, LineFormat::Json);
        assert_eq!(out.matches('\n').count(), 1, "{out}");
        assert!(
            !out.contains(['\u{2028}', '\u{2029}', '\u{7f}', '\u{85}']),
            "{out}"
        );
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back["model"], sent);
    }
}
