//! The Python `str` and `dict` methods chat templates call, which minijinja lacks.

use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

/// The Python `str` and `dict` methods chat templates use, which minijinja does not have.
pub(super) fn python_method(
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
    match method {
        "strip" => strip(s, Side::Both, args),
        "lstrip" => strip(s, Side::Start, args),
        "rstrip" => strip(s, Side::End, args),
        "startswith" | "endswith" => affix_test(s, method, args),
        "upper" => no_args(args).map(|()| Value::from(s.to_uppercase())),
        "lower" => no_args(args).map(|()| Value::from(s.to_lowercase())),
        "title" => no_args(args).map(|()| Value::from(title_case(s))),
        "capitalize" => no_args(args).map(|()| Value::from(capitalized(s))),
        "replace" => replace(s, args),
        "split" => split(s, args),
        "splitlines" => {
            no_args(args).map(|()| Value::from(s.lines().map(Value::from).collect::<Vec<_>>()))
        }
        "join" => join(s, args),
        "find" => find(s, args),
        "count" => count(s, args),
        "isdigit" | "isnumeric" => no_args(args).map(|()| all_chars(s, char::is_numeric)),
        "isalpha" => no_args(args).map(|()| all_chars(s, char::is_alphabetic)),
        "isspace" => no_args(args).map(|()| all_chars(s, char::is_whitespace)),
        "islower" => no_args(args).map(|()| only_cased(s, char::is_lowercase, char::is_uppercase)),
        "isupper" => no_args(args).map(|()| only_cased(s, char::is_uppercase, char::is_lowercase)),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

/// A method that takes no arguments was given none.
fn no_args(args: &[Value]) -> Result<(), Error> {
    from_args(args)
}

/// The end(s) of a string the strip family trims.
enum Side {
    Both,
    Start,
    End,
}

/// `strip`, `lstrip` and `rstrip`: Python's take an optional set of characters; `None` means
/// whitespace.
fn strip(s: &str, side: Side, args: &[Value]) -> Result<Value, Error> {
    let (chars,): (Option<&str>,) = from_args(args)?;
    let set: Option<Vec<char>> = chars.map(|c| c.chars().collect());
    let stripped = match (side, set) {
        (Side::Both, Some(set)) => s.trim_matches(set.as_slice()),
        (Side::Both, None) => s.trim(),
        (Side::Start, Some(set)) => s.trim_start_matches(set.as_slice()),
        (Side::Start, None) => s.trim_start(),
        (Side::End, Some(set)) => s.trim_end_matches(set.as_slice()),
        (Side::End, None) => s.trim_end(),
    };
    Ok(Value::from(stripped))
}

/// `startswith` and `endswith`, which in Python also accept a tuple of candidates.
fn affix_test(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let (needle,): (Value,) = from_args(args)?;
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
    Ok(Value::from(hit))
}

/// Python's `capitalize`: the first character upper case, the rest lower case.
fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// `replace(old, new[, count])`; a negative count replaces every occurrence.
fn replace(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
    Ok(match count {
        Some(n) if n >= 0 => {
            Value::from(s.replacen(old, new, usize::try_from(n).unwrap_or(usize::MAX)))
        }
        _ => Value::from(s.replace(old, new)),
    })
}

/// `split([sep[, maxsplit]])`: without a separator, on runs of whitespace.
fn split(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
    let limit = maxsplit
        .filter(|n| *n >= 0)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1));
    let parts: Vec<Value> = match (sep, limit) {
        (Some(""), _) => return Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        (Some(sep), Some(n)) => s.splitn(n, sep).map(Value::from).collect(),
        (Some(sep), None) => s.split(sep).map(Value::from).collect(),
        (None, Some(n)) => split_whitespace_n(s, n),
        (None, None) => s.split_whitespace().map(Value::from).collect(),
    };
    Ok(Value::from(parts))
}

/// `sep.join(items)`, each item written as its string.
fn join(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (items,): (Value,) = from_args(args)?;
    let mut out = String::new();
    for (i, item) in items.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(s);
        }
        out.push_str(&item.to_string());
    }
    Ok(Value::from(out))
}

/// `find(needle)`: the character index of the first match, or -1.
fn find(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (needle,): (&str,) = from_args(args)?;
    let index = s
        .find(needle)
        .map_or(-1, |byte| s[..byte].chars().count() as i64);
    Ok(Value::from(index))
}

/// `count(needle)`: Python counts an empty needle once per character boundary.
fn count(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (needle,): (&str,) = from_args(args)?;
    let n = if needle.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(needle).count()
    };
    Ok(Value::from(n))
}

/// `isdigit`, `isalpha` and the like: a non-empty string whose every character passes.
fn all_chars(s: &str, test: fn(char) -> bool) -> Value {
    Value::from(!s.is_empty() && s.chars().all(test))
}

/// `islower` and `isupper`: some character of the case asked for and none of the other.
fn only_cased(s: &str, case: fn(char) -> bool, other: fn(char) -> bool) -> Value {
    Value::from(s.chars().any(case) && !s.chars().any(other))
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
