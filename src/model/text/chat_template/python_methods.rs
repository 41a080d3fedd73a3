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
