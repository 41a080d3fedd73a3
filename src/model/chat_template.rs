//! Chat templates: turning a list of chat messages into the exact prompt text a model was
//! fine-tuned on.
//!
//! Models ship their prompt format as a Jinja2 template (`tokenizer.chat_template` in GGUF,
//! `chat_template` in Hugging Face's `tokenizer_config.json`). Those templates are written for
//! Python's Jinja2 as used by `transformers`, so rendering them faithfully needs more than plain
//! Jinja: the `trim_blocks`/`lstrip_blocks` whitespace settings `transformers` uses, the helper
//! functions it injects (`raise_exception`, `strftime_now`), a Python-flavoured `tojson`, and the
//! Python `str`/`dict` methods templates call (`.strip()`, `.startswith()`, `.items()`, ...).
//! This module provides exactly that on top of minijinja, without further dependencies.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{from_args, Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

/// Name under which the single template lives in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
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

/// `transformers` injects `strftime_now` so templates (Llama 3.x) can print today's date.
/// Implemented on `std::time` (UTC) to stay dependency-free; covers the common directives.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats a Unix timestamp (UTC) with a subset of C `strftime` directives; unknown
/// directives are kept verbatim so a template never fails over a date.
fn strftime(format: &str, unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (
        secs_of_day / 3600,
        (secs_of_day / 60) % 60,
        secs_of_day % 60,
    );
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = ((days + 3) % 7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday_name[..3]),
            Some('A') => out.push_str(weekday_name),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31); Howard Hinnant's
/// `civil_from_days`, restricted to dates after the epoch.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
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

/// The Python `str` and `dict` methods chat templates use, which minijinja does not have.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            string_method(s, method, args)
        }
        ValueKind::Map => map_method(state, value, method, args),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    // Python's strip family takes an optional set of characters; `None` means whitespace.
    let strip_set = |args: &[Value]| -> Result<Option<Vec<char>>, Error> {
        let (chars,): (Option<&str>,) = from_args(args)?;
        Ok(chars.map(|c| c.chars().collect()))
    };
    let rv = match method {
        "strip" => match strip_set(args)? {
            Some(set) => Value::from(s.trim_matches(set.as_slice())),
            None => Value::from(s.trim()),
        },
        "lstrip" => match strip_set(args)? {
            Some(set) => Value::from(s.trim_start_matches(set.as_slice())),
            None => Value::from(s.trim_start()),
        },
        "rstrip" => match strip_set(args)? {
            Some(set) => Value::from(s.trim_end_matches(set.as_slice())),
            None => Value::from(s.trim_end()),
        },
        "startswith" | "endswith" => {
            let (needle,): (Value,) = from_args(args)?;
            // Python also accepts a tuple of candidates.
            let candidates: Vec<String> = match needle.kind() {
                ValueKind::Seq => needle
                    .try_iter()?
                    .map(|v| v.as_str().map(str::to_owned).unwrap_or_default())
                    .collect(),
                _ => vec![needle.as_str().map(str::to_owned).ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "expected a string argument")
                })?],
            };
            let hit = candidates.iter().any(|c| {
                if method == "startswith" {
                    s.starts_with(c.as_str())
                } else {
                    s.ends_with(c.as_str())
                }
            });
            Value::from(hit)
        }
        "upper" => {
            let _: () = from_args(args)?;
            Value::from(s.to_uppercase())
        }
        "lower" => {
            let _: () = from_args(args)?;
            Value::from(s.to_lowercase())
        }
        "title" => {
            let _: () = from_args(args)?;
            Value::from(title_case(s))
        }
        "capitalize" => {
            let _: () = from_args(args)?;
            let mut chars = s.chars();
            let capitalized = match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            };
            Value::from(capitalized)
        }
        "replace" => {
            let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
            match count {
                Some(n) if n >= 0 => {
                    Value::from(s.replacen(old, new, usize::try_from(n).unwrap_or(usize::MAX)))
                }
                _ => Value::from(s.replace(old, new)),
            }
        }
        "split" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let limit = maxsplit
                .filter(|n| *n >= 0)
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1));
            let parts: Vec<Value> = match (sep, limit) {
                (Some(""), _) => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"))
                }
                (Some(sep), Some(n)) => s.splitn(n, sep).map(Value::from).collect(),
                (Some(sep), None) => s.split(sep).map(Value::from).collect(),
                (None, Some(n)) => split_whitespace_n(s, n),
                (None, None) => s.split_whitespace().map(Value::from).collect(),
            };
            Value::from(parts)
        }
        "splitlines" => {
            let _: () = from_args(args)?;
            Value::from(s.lines().map(Value::from).collect::<Vec<_>>())
        }
        "join" => {
            let (items,): (Value,) = from_args(args)?;
            let mut out = String::new();
            for (i, item) in items.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(s);
                }
                out.push_str(&item.to_string());
            }
            Value::from(out)
        }
        "find" => {
            let (needle,): (&str,) = from_args(args)?;
            let index = s
                .find(needle)
                .map_or(-1, |byte| s[..byte].chars().count() as i64);
            Value::from(index)
        }
        "count" => {
            let (needle,): (&str,) = from_args(args)?;
            let n = if needle.is_empty() {
                s.chars().count() + 1
            } else {
                s.matches(needle).count()
            };
            Value::from(n)
        }
        "isdigit" | "isnumeric" => {
            let _: () = from_args(args)?;
            Value::from(!s.is_empty() && s.chars().all(char::is_numeric))
        }
        "isalpha" => {
            let _: () = from_args(args)?;
            Value::from(!s.is_empty() && s.chars().all(char::is_alphabetic))
        }
        "isspace" => {
            let _: () = from_args(args)?;
            Value::from(!s.is_empty() && s.chars().all(char::is_whitespace))
        }
        "islower" => {
            let _: () = from_args(args)?;
            Value::from(s.chars().any(char::is_lowercase) && !s.chars().any(char::is_uppercase))
        }
        "isupper" => {
            let _: () = from_args(args)?;
            Value::from(s.chars().any(char::is_uppercase) && !s.chars().any(char::is_lowercase))
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    };
    Ok(rv)
}

/// Python's `str.split(None, maxsplit)`: at most `parts` pieces, the last one holding the
/// rest of the string with its leading whitespace removed.
fn split_whitespace_n(s: &str, parts: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        if out.len() + 1 >= parts {
            out.push(Value::from(rest.trim_end()));
            break;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        out.push(Value::from(&rest[..end]));
        rest = rest[end..].trim_start();
    }
    out
}

fn title_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at_word_start = true;
    for c in s.chars() {
        if c.is_alphabetic() {
            if at_word_start {
                out.extend(c.to_uppercase());
            } else {
                out.extend(c.to_lowercase());
            }
            at_word_start = false;
        } else {
            out.push(c);
            at_word_start = true;
        }
    }
    out
}

fn map_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    match method {
        "items" => {
            let _: () = from_args(args)?;
            state.apply_filter("items", std::slice::from_ref(value))
        }
        "keys" => {
            let _: () = from_args(args)?;
            Ok(Value::from(value.try_iter()?.collect::<Vec<_>>()))
        }
        "values" => {
            let _: () = from_args(args)?;
            let values = value
                .try_iter()?
                .map(|k| value.get_item(&k))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::from(values))
        }
        "get" => {
            let (key, default): (Value, Option<Value>) = from_args(args)?;
            let found = value.get_item(&key)?;
            Ok(if found.is_undefined() {
                default.unwrap_or(Value::from(()))
            } else {
                found
            })
        }
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 00:00:00 UTC, the date Llama 3.1's template hard-codes as a fallback.
        let ts = 1_721_952_000;
        assert_eq!(strftime("%d %b %Y", ts), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %e, %y %H:%M:%S %%", ts),
            "Friday July 26, 24 00:00:00 %"
        );
        assert_eq!(strftime("%F", 951_782_400), "2000-02-29");
        assert_eq!(strftime("%Q", 0), "%Q");
    }
}
