//! Bounds on what a constraint may hold, checked before llguidance sees it.
//!
//! Why it exists: llguidance compiles a schema's `$ref` chain, a Lark grammar's chain of rules
//! and a regex's nesting by recursion, and builds one lexeme per choice; a request of a few
//! kilobytes could overflow the compiling thread's stack (aborting the whole process) or keep
//! a core busy for many seconds. Each bound here is far above what real schemas and grammars
//! use (OpenAI's structured outputs allow 10 levels of nesting and 5,000 properties) and below
//! what the compile threads' stack and deadline were measured to take (docs/operations.md,
//! "Structured outputs: limits"). The walks are linear in the input and recurse at most to
//! the depth bound.

use std::collections::HashMap;

use regex_syntax::hir::{Hir, HirKind};
use serde_json::Value;

use super::{ConstraintError, ConstraintSpec, JsonWhitespace};

/// Objects nested in a JSON schema, counting each `$ref` followed as one level (a chain of
/// `$defs` costs about four levels a link).
pub const MAX_SCHEMA_DEPTH: usize = 512;
/// Properties over a whole schema (every `properties` object's keys).
pub const MAX_SCHEMA_PROPERTIES: usize = 5_000;
/// Properties one object may leave optional: each keeps about four parser items open at
/// every position of the object, and a row holds at most `max_items_in_row` (2,000).
pub const MAX_OPTIONAL_PROPERTIES: usize = 400;
/// Values of one `enum`, and choices of `guided_choice`.
pub const MAX_ENUM_VALUES: usize = 100_000;
/// Rules and terminals of a Lark grammar.
pub const MAX_GRAMMAR_RULES: usize = 1_000;
/// Brackets nested in a Lark grammar, and groups nested in a regex.
pub const MAX_GRAMMAR_NESTING: usize = 64;
/// Counted repetitions nested in a regex, their counts multiplied (`(\w{1,50}){1,50}` counts
/// 2,500): the lexer's derivatives of such a regex grow with the product. A repetition that
/// nests no other (`\w{1,10000}`) is not bounded.
pub const MAX_NESTED_REPETITION: u64 = 256;

fn too_complex(what: String) -> ConstraintError {
    ConstraintError::TooComplex(what)
}

/// Checks `spec` against the bounds above.
pub fn check(spec: &ConstraintSpec) -> Result<(), ConstraintError> {
    match spec {
        ConstraintSpec::JsonObject(ws) => check_whitespace(ws),
        ConstraintSpec::JsonSchema(schema, ws) => {
            check_whitespace(ws)?;
            check_schema(schema)
        }
        ConstraintSpec::Regex(rx) => check_regex(rx),
        ConstraintSpec::Choice(options) => {
            if options.len() > MAX_ENUM_VALUES {
                return Err(too_complex(format!(
                    "{} choices; at most {MAX_ENUM_VALUES} are allowed",
                    options.len()
                )));
            }
            Ok(())
        }
        ConstraintSpec::Lark(grammar) => check_lark(grammar),
    }
}

fn check_whitespace(ws: &JsonWhitespace) -> Result<(), ConstraintError> {
    match ws {
        JsonWhitespace::Pattern(p) => check_regex(p),
        _ => Ok(()),
    }
}

/// Checks a JSON schema: its depth through refs, its properties, enums and patterns.
pub fn check_schema(schema: &Value) -> Result<(), ConstraintError> {
    let mut walk = SchemaWalk {
        root: schema,
        refs: HashMap::new(),
        properties: 0,
    };
    walk.refs.insert(String::new(), Some(0));
    walk.height(schema, 0)?;
    Ok(())
}

struct SchemaWalk<'a> {
    root: &'a Value,
    /// Each followed `$ref` target's height; `None` while it is being walked (a recursive
    /// schema: llguidance stops there too).
    refs: HashMap<String, Option<usize>>,
    properties: usize,
}

/// Keys whose values are data, not schemas.
const DATA_KEYS: [&str; 5] = ["const", "enum", "default", "examples", "x-guidance"];
/// Keys holding definitions: walked only where a `$ref` reaches them.
const DEFINITION_KEYS: [&str; 2] = ["$defs", "definitions"];

impl<'a> SchemaWalk<'a> {
    /// The number of objects nested from `v` down (refs followed), refusing past the bound.
    fn height(&mut self, v: &'a Value, level: usize) -> Result<usize, ConstraintError> {
        if level >= MAX_SCHEMA_DEPTH {
            return Err(too_complex(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (objects and $ref \
                 hops counted)"
            )));
        }
        match v {
            Value::Array(items) => {
                let mut h = 0;
                for item in items {
                    h = h.max(self.height(item, level)?);
                }
                Ok(h)
            }
            Value::Object(map) => {
                self.check_keywords(map)?;
                let mut h = 0;
                for (key, value) in map {
                    if DATA_KEYS.contains(&key.as_str()) || DEFINITION_KEYS.contains(&key.as_str())
                    {
                        continue;
                    }
                    if key == "$ref" {
                        if let Some(target) = value.as_str() {
                            h = h.max(self.ref_height(target, level)?);
                        }
                        continue;
                    }
                    h = h.max(self.height(value, level + 1)?);
                }
                Ok(h + 1)
            }
            _ => Ok(0),
        }
    }

    fn ref_height(&mut self, target: &str, level: usize) -> Result<usize, ConstraintError> {
        let Some(pointer) = target.strip_prefix('#') else {
            return Ok(0); // Not a local ref: llguidance refuses it.
        };
        let pointer = percent_decoded(pointer);
        let h = match self.refs.get(&pointer) {
            Some(Some(h)) => *h,
            Some(None) => 0,
            None => {
                let Some(node) = self.root.pointer(&pointer) else {
                    return Ok(0); // A dangling ref: llguidance says which.
                };
                self.refs.insert(pointer.clone(), None);
                let h = self.height(node, level + 1)?;
                self.refs.insert(pointer, Some(h));
                h
            }
        };
        if level + 1 + h > MAX_SCHEMA_DEPTH {
            return Err(too_complex(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (objects and $ref \
                 hops counted)"
            )));
        }
        Ok(h + 1)
    }

    /// The keywords of one schema object that llguidance expands by their size.
    fn check_keywords(
        &mut self,
        map: &serde_json::Map<String, Value>,
    ) -> Result<(), ConstraintError> {
        if let Some(Value::Object(props)) = map.get("properties") {
            self.properties += props.len();
            if self.properties > MAX_SCHEMA_PROPERTIES {
                return Err(too_complex(format!(
                    "the schema has more than {MAX_SCHEMA_PROPERTIES} properties"
                )));
            }
            let required = map.get("required").and_then(Value::as_array);
            let optional = props
                .keys()
                .filter(|k| !required.is_some_and(|r| r.iter().any(|v| v.as_str() == Some(k))))
                .count();
            if optional > MAX_OPTIONAL_PROPERTIES {
                return Err(too_complex(format!(
                    "an object has {optional} optional properties; at most \
                     {MAX_OPTIONAL_PROPERTIES} may be left out of `required`"
                )));
            }
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            if values.len() > MAX_ENUM_VALUES {
                return Err(too_complex(format!(
                    "an enum has {} values; at most {MAX_ENUM_VALUES} are allowed",
                    values.len()
                )));
            }
        }
        if let Some(Value::String(rx)) = map.get("pattern") {
            check_regex(rx)?;
        }
        if let Some(Value::Object(patterns)) = map.get("patternProperties") {
            for rx in patterns.keys() {
                check_regex(rx)?;
            }
        }
        Ok(())
    }
}

/// A JSON pointer from a URI fragment (`#/$defs/My%20Type`).
fn percent_decoded(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a regex's nesting and its counted repetitions. A regex that does not parse is left
/// to llguidance, which says why.
pub fn check_regex(rx: &str) -> Result<(), ConstraintError> {
    let parsed = regex_syntax::ParserBuilder::new()
        .nest_limit(MAX_GRAMMAR_NESTING as u32)
        .build()
        .parse(rx);
    let hir = match parsed {
        Ok(hir) => hir,
        Err(regex_syntax::Error::Parse(e))
            if matches!(e.kind(), regex_syntax::ast::ErrorKind::NestLimitExceeded(_)) =>
        {
            return Err(too_complex(format!(
                "a regex nests more than {MAX_GRAMMAR_NESTING} groups"
            )))
        }
        Err(_) => return Ok(()),
    };
    let (product, levels) = nested_repetition(&hir);
    if levels >= 2 && product > MAX_NESTED_REPETITION {
        return Err(too_complex(format!(
            "a regex nests counted repetitions {product} times over (`{}`); at most \
             {MAX_NESTED_REPETITION} are allowed",
            shortened(rx)
        )));
    }
    Ok(())
}

/// Along the nesting path whose counted repetitions multiply to the most: that product and
/// how many counted repetitions it has. `*`, `+` and `?` are not counted.
fn nested_repetition(hir: &Hir) -> (u64, u32) {
    match hir.kind() {
        HirKind::Repetition(r) => {
            let (inner, levels) = nested_repetition(&r.sub);
            let count = u64::from(r.max.unwrap_or(r.min));
            if count > 1 {
                (count.saturating_mul(inner), levels + 1)
            } else {
                (inner, levels)
            }
        }
        HirKind::Capture(c) => nested_repetition(&c.sub),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => {
            parts.iter().map(nested_repetition).max().unwrap_or((1, 0))
        }
        _ => (1, 0),
    }
}

fn shortened(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Checks a Lark grammar: its rule count, bracket nesting, regex literals and `%json`
/// schemas.
pub fn check_lark(grammar: &str) -> Result<(), ConstraintError> {
    let rules = grammar.lines().filter(|l| defines_rule(l)).count();
    if rules > MAX_GRAMMAR_RULES {
        return Err(too_complex(format!(
            "the grammar has {rules} rules; at most {MAX_GRAMMAR_RULES} are allowed"
        )));
    }
    let mut depth = 0usize;
    let mut rest = grammar;
    while let Some(c) = rest.chars().next() {
        let after = &rest[c.len_utf8()..];
        rest = match c {
            '"' => skip_quoted(after, c),
            '/' if after.starts_with('/') => after.find('\n').map_or("", |n| &after[n..]),
            '/' => {
                let end = quoted_end(after, '/');
                check_regex(&after[..end.saturating_sub(1)])?;
                &after[end..]
            }
            '%' if after.starts_with("json") => {
                let body = after["json".len()..].trim_start();
                let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
                match values.next() {
                    Some(Ok(schema)) => {
                        check_schema(&schema)?;
                        &body[values.byte_offset()..]
                    }
                    _ => after,
                }
            }
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_GRAMMAR_NESTING {
                    return Err(too_complex(format!(
                        "the grammar nests more than {MAX_GRAMMAR_NESTING} brackets"
                    )));
                }
                after
            }
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                after
            }
            _ => after,
        };
    }
    Ok(())
}

/// Whether a line of a Lark grammar starts a rule or terminal (`name:`, `?name:`,
/// `NAME.2:`).
fn defines_rule(line: &str) -> bool {
    let l = line.trim_start().trim_start_matches(['?', '!']);
    let name_len = l
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(l.len());
    if name_len == 0 || l.starts_with(|c: char| c.is_ascii_digit()) {
        return false;
    }
    let rest = l[name_len..].trim_start();
    let rest = match rest.strip_prefix('.') {
        Some(p) => p.trim_start_matches(|c: char| c == '-' || c.is_ascii_digit()),
        None => rest,
    };
    rest.trim_start().starts_with(':')
}

/// The byte just past the closing `quote` of a literal whose opening quote was consumed
/// (escapes skipped); the end of the text when it never closes.
fn quoted_end(s: &str, quote: char) -> usize {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == quote {
            return i + c.len_utf8();
        }
    }
    s.len()
}

fn skip_quoted(s: &str, quote: char) -> &str {
    &s[quoted_end(s, quote)..]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("D{i}"),
                json!({"type": "object", "properties": {"next": {"$ref": format!("#/$defs/D{}", i + 1)}}}),
            );
        }
        defs.insert(format!("D{n}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/D0"})
    }

    #[test]
    fn ref_chains_count_each_hop_and_recursion_stops_at_itself() {
        assert!(check_schema(&ref_chain(20)).is_ok());
        let e = check_schema(&ref_chain(300)).unwrap_err();
        assert!(e.to_string().contains("nests deeper"), "{e}");
        // A recursive schema (a tree) is fine: the walk stops where it came from.
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"});
        assert!(check_schema(&tree).is_ok());
        let root_ref = json!({"type": "object", "properties": {"self": {"$ref": "#"}}});
        assert!(check_schema(&root_ref).is_ok());
    }

    #[test]
    fn wide_objects_and_long_enums_are_bounded() {
        let wide: serde_json::Map<String, Value> = (0..8000)
            .map(|i| (format!("f{i}"), json!({"type": "string"})))
            .collect();
        let required: Vec<String> = (0..8000).map(|i| format!("f{i}")).collect();
        let e = check_schema(&json!({"properties": wide, "required": required})).unwrap_err();
        assert!(e.to_string().contains("properties"), "{e}");
        let some: serde_json::Map<String, Value> = (0..401)
            .map(|i| (format!("f{i}"), json!({"type": "string"})))
            .collect();
        let e = check_schema(&json!({"properties": some})).unwrap_err();
        assert!(e.to_string().contains("optional"), "{e}");
        let e = check_schema(&json!({"enum": (0..100_001).collect::<Vec<_>>()})).unwrap_err();
        assert!(e.to_string().contains("enum"), "{e}");
        assert!(check_schema(&json!({"enum": (0..5000).collect::<Vec<_>>()})).is_ok());
        // An enum's values are data: a value shaped like a schema is not walked.
        assert!(check_schema(&json!({"enum": [{"$ref": "#/nowhere"}]})).is_ok());
    }

    #[test]
    fn regexes_are_bounded_by_nested_repetition_and_nesting() {
        assert!(check_regex(r"\d{3}-\d{4}").is_ok());
        assert!(check_regex(r"(\w{1,10} ){1,20}").is_ok());
        assert!(check_regex(r"[a-z]+(,[a-z]*)*").is_ok());
        assert!(check_regex(r"\w{1,10000}").is_ok());
        assert!(check_regex(r"(\d{1,3}\.){3}\d{1,3}").is_ok());
        let e = check_regex(r"(\w{1,50}){1,50}").unwrap_err();
        assert!(e.to_string().contains("2500"), "{e}");
        assert!(check_regex(r"((a{2}){3}){50}").is_err());
        let deep = format!("{}a{}", "(".repeat(100), ")".repeat(100));
        assert!(check_regex(&deep).is_err());
        // What does not parse is llguidance's to refuse.
        assert!(check_regex("(").is_ok());
        let e = check_schema(&json!({"type": "string", "pattern": "(a{1,100}){1,100}"}));
        assert!(e.is_err());
    }

    #[test]
    fn lark_grammars_are_bounded_by_rules_nesting_regexes_and_embedded_schemas() {
        let chain = |n: usize| {
            let mut g = String::from("start: r0\n");
            for i in 0..n {
                g += &format!("r{i}: \"a\" r{}\n", i + 1);
            }
            g + &format!("r{n}: \"b\"\n")
        };
        assert!(check_lark(&chain(100)).is_ok());
        assert!(check_lark(&chain(1500))
            .unwrap_err()
            .to_string()
            .contains("rules"));
        let parens = format!("start: {}\"a\"{}\n", "(".repeat(100), ")".repeat(100));
        assert!(check_lark(&parens).is_err());
        // Brackets inside strings, regexes and comments are text.
        let text = format!(
            "start: \"{}\" /[(]{{2}}/ // {}\n",
            "(".repeat(100),
            "[".repeat(100)
        );
        assert!(check_lark(&text).is_ok());
        assert!(check_lark("start: /(a{1,100}){1,100}/\n").is_err());
        let embedded = format!("start: %json {}\n", ref_chain(300));
        assert!(check_lark(&embedded).is_err());
        assert!(check_lark(&format!("start: %json {}\n", ref_chain(3))).is_ok());
        assert!(defines_rule("?expr.2 : a"));
        assert!(defines_rule("NUMBER: /[0-9]+/"));
        assert!(!defines_rule("    | b c"));
    }
}
