//! The shape of the library, checked from its sources: layers only point down, and no two
//! files (nor two of the model layer's folders) import each other, directly or around a circle.
//!
//! Why it exists: the layering (model, sampling, constraint, draft, engine, server) is what lets each part
//! be tested and replaced alone, and it erodes one convenient `use` at a time. This test reads
//! every `use` of the library's non-test code, resolves it to the file that defines what it
//! names (through re-exports: `super::Decoder` is `model/decoder/model.rs`, not `model/mod.rs`),
//! and fails on an arrow that points up a layer or closes a circle. A re-export (`pub use`) is
//! a door, not a dependency of the file that has it: it is followed, never an arrow itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers, lowest first: a file may import its own layer or a lower one.
const LAYERS: [&str; 6] = [
    "model",
    "sampling",
    "constraint",
    "draft",
    "engine",
    "server",
];
/// Modules that start the layers from a config file; only the server, at the top, may use them.
const ABOVE_THE_LAYERS: [&str; 4] = ["config", "setup", "bench", "train"];

/// A library source file and the module path it defines (`engine::scheduler` for
/// `src/engine/scheduler/mod.rs`).
struct Source {
    file: String,
    module: Vec<String>,
    text: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut out = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let name = rel.rsplit('/').next().unwrap();
        // The binary (its own crate) and test-only files are not the library's shape.
        if rel == "main.rs"
            || rel.starts_with("cli/")
            || name == "tests.rs"
            || name == "test_support.rs"
            || name.ends_with("_tests.rs")
        {
            continue;
        }
        let mut module: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = without_test_modules(&text);
        out.push(Source {
            file: rel,
            module,
            text,
        });
    }
    out
}

/// The text without its `#[cfg(test)]` modules: test code imports freely.
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let item_end = after.find(['{', ';']).unwrap_or(after.len());
        let is_module = after[..item_end].contains("mod ");
        if !is_module || after[item_end..].starts_with(';') {
            // A test-only item or a `mod x;` declaration: drop the attribute line only.
            let line_end = after.find('\n').map_or(after.len(), |n| n + 1);
            rest = &after[line_end..];
            if is_module {
                rest = &after[item_end + 1..];
            }
            continue;
        }
        let mut depth = 0;
        let mut end = after.len();
        for (k, c) in after[item_end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = item_end + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every path a file's own code names: its private `use` declarations, braces expanded
/// (`a::{b, c::d}` gives `a::b` and `a::c::d`), and paths written out in code.
fn use_paths(text: &str) -> Vec<String> {
    let mut paths = use_declarations(text, false);
    paths.extend(inline_paths(text));
    paths
}

/// The paths of a file's `use` declarations: its re-exports (`pub use`, `pub(crate) use`, ...)
/// or its private ones.
fn use_declarations(text: &str, reexports: bool) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("use ") {
        let before = &rest[..i];
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        let prefix = before[line_start..].trim();
        let public = prefix == "pub" || prefix.starts_with("pub(");
        let at_statement = prefix.is_empty() || public;
        let Some(end) = rest[i..].find(';') else {
            break;
        };
        if at_statement && public == reexports {
            let body: String = rest[i + 4..i + end]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            expand("", &body, &mut paths);
        }
        rest = &rest[i + end..];
    }
    paths
}

/// Paths written out in code rather than imported (`super::kernel::run(..)`), outside comments.
fn inline_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        // `use` declarations are read whole by `use_declarations`.
        let statement = code.trim_start();
        let statement = statement
            .strip_prefix("pub")
            .map(|r| r.trim_start_matches(|c: char| c != ' ').trim_start())
            .unwrap_or(statement);
        if statement.starts_with("use ") {
            continue;
        }
        for start in ["crate::", "super::", "self::"] {
            let mut from = 0;
            while let Some(i) = code[from..].find(start) {
                let at = from + i;
                let boundary = code[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
                let len = code[at..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(code.len() - at);
                if boundary {
                    paths.push(code[at..at + len].trim_end_matches(':').to_string());
                }
                from = at + len.max(1);
            }
        }
    }
    paths
}

fn expand(prefix: &str, body: &str, out: &mut Vec<String>) {
    match body.find('{') {
        None => out.push(format!("{prefix}{body}")),
        Some(open) => {
            let head = format!("{prefix}{}", &body[..open]);
            let inner = &body[open + 1..body.len() - 1];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&head, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            if start < inner.len() {
                expand(&head, &inner[start..], out);
            }
        }
    }
}

/// The files each file imports from, by resolving `crate::`, `super::` and `self::` paths to
/// the deepest module that has a file, and an item that module re-exports to where it comes
/// from.
fn arrows(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let index = Index::new(sources);
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        let own = arrows.entry(s.file.clone()).or_default();
        for path in use_paths(&s.text) {
            if let Some(t) = index.resolve(&s.module, &path, 0).filter(|t| *t != s.file) {
                own.insert(t);
            }
        }
    }
    arrows
}

/// Module paths to files, and each file's re-exports (name to the path it re-exports).
struct Index {
    files: BTreeMap<Vec<String>, String>,
    modules: BTreeMap<String, Vec<String>>,
    reexports: BTreeMap<String, BTreeMap<String, String>>,
}

impl Index {
    fn new(sources: &[Source]) -> Self {
        let files = sources
            .iter()
            .map(|s| (s.module.clone(), s.file.clone()))
            .collect();
        let modules = sources
            .iter()
            .map(|s| (s.file.clone(), s.module.clone()))
            .collect();
        let reexports = sources
            .iter()
            .map(|s| {
                let names = use_declarations(&s.text, true)
                    .into_iter()
                    .filter_map(|p| Some((p.rsplit("::").next()?.to_string(), p)))
                    .collect();
                (s.file.clone(), names)
            })
            .collect();
        Self {
            files,
            modules,
            reexports,
        }
    }

    /// The file `path`, written in module `from`, names; `None` for something external.
    fn resolve(&self, from: &[String], path: &str, depth: usize) -> Option<String> {
        let mut segs = path.split("::").filter(|p| !p.is_empty()).peekable();
        let mut module: Vec<String> = match *segs.peek()? {
            "crate" => {
                segs.next();
                Vec::new()
            }
            "self" => {
                segs.next();
                from.to_vec()
            }
            "super" => {
                // `a/b.rs` is module a::b and `a/mod.rs` module a: either way `super` is one
                // step up.
                let mut m = from.to_vec();
                while segs.peek() == Some(&"super") {
                    m.pop();
                    segs.next();
                }
                m
            }
            // A name in scope: a child module (`mod x;` here) or something external.
            first => {
                let mut child = from.to_vec();
                child.push(first.to_string());
                if !self.files.contains_key(&child) {
                    return None;
                }
                from.to_vec()
            }
        };
        let mut target = self.files.get(&module).cloned();
        for seg in segs {
            module.push(seg.to_string());
            if let Some(f) = self.files.get(&module) {
                target = Some(f.clone());
                continue;
            }
            // An item of `target`: where it comes from, if `target` re-exports it.
            let file = target.clone()?;
            let doorway = self.reexports.get(&file).and_then(|r| r.get(seg));
            if let (Some(p), true) = (doorway, depth < 8) {
                let at = &self.modules[&file];
                if let Some(t) = self.resolve(at, p, depth + 1) {
                    return Some(t);
                }
            }
            break;
        }
        target
    }
}

#[test]
fn layers_only_point_down() {
    let sources = sources();
    let layer_of = |file: &str| file.split(['/', '.']).next().unwrap_or("").to_string();
    let mut wrong = Vec::new();
    for (from, tos) in arrows(&sources) {
        let from_layer = layer_of(&from);
        let Some(rank) = LAYERS.iter().position(|l| *l == from_layer) else {
            continue;
        };
        for to in tos {
            let to_layer = layer_of(&to);
            let up = LAYERS
                .iter()
                .position(|l| *l == to_layer)
                .is_some_and(|r| r > rank);
            let starter = ABOVE_THE_LAYERS.contains(&to_layer.as_str())
                && (from_layer != "server" || to_layer == "bench");
            if up || starter {
                wrong.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up a layer: {wrong:#?}"
    );
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let sources = sources();
    let arrows = arrows(&sources);
    let mut circles = Vec::new();
    for start in arrows.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in arrows.get(&at).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start.clone());
                    circles.push(circle.join(" -> "));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

/// The model layer's folders (`spec`, `load`, `arch`, `decoder`, `kernels`, ...) form a
/// hierarchy too: the hyperparameters and block description in `spec` are the leaf the readers,
/// the families and the forward all use, so that none of them needs another's folder back.
#[test]
fn the_model_layers_folders_never_import_each_other_around_a_circle() {
    let folder_of = |file: &str| {
        let parts: Vec<&str> = file.split('/').collect();
        (parts.len() > 2 && parts[0] == "model").then(|| parts[1].to_string())
    };
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in arrows(&sources()) {
        let Some(a) = folder_of(&from) else { continue };
        for to in tos {
            if let Some(b) = folder_of(&to).filter(|b| *b != a) {
                folders.entry(a.clone()).or_default().insert(b);
            }
        }
    }
    assert!(
        folders.get("spec").is_none_or(|t| t.is_empty()),
        "spec is the leaf: {folders:#?}"
    );
    for (start, _) in folders.iter() {
        let mut stack = vec![start.clone()];
        let mut seen = BTreeSet::new();
        while let Some(at) = stack.pop() {
            for next in folders.get(&at).into_iter().flatten() {
                assert!(
                    next != start,
                    "model/{start}/ reaches itself through model/{at}/: {folders:#?}"
                );
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
    }
}

#[test]
fn the_resolver_sees_real_arrows() {
    // The checks above pass vacuously if nothing resolves: the engine's scheduler does import
    // the governor, and `super::` in a mod.rs names the parent.
    let sources = sources();
    let arrows = arrows(&sources);
    let from = |f: &str| arrows.get(f).cloned().unwrap_or_default();
    assert!(from("engine/scheduler/state.rs")
        .iter()
        .any(|f| f.starts_with("engine/governor/")));
    assert!(from("engine/scheduler/round.rs").contains("engine/scheduler/round_plan.rs"));
    assert!(from("engine/handle.rs").contains("engine/calibration.rs"));
    // Through a re-export: `crate::model::Decoder` is defined in `model/decoder/model.rs`.
    assert!(from("engine/verifier.rs").contains("model/decoder/model.rs"));
    assert!(
        !from("engine/verifier.rs").contains("model/mod.rs"),
        "{:?}",
        from("engine/verifier.rs")
    );
    let paths = use_paths(
        "use a::{b, c::{d, e}};\npub(crate) use f::g;\nx = super::h::i(1); // crate::j\n",
    );
    assert_eq!(paths, ["a::b", "a::c::d", "a::c::e", "super::h::i"]);
    let doors = use_declarations("use a::b;\npub(crate) use f::{g, h};\n", true);
    assert_eq!(doors, ["f::g", "f::h"]);
}

// ---------------------------------------------------------------------------------------------
// docs/architecture.md names only what the code still has.
//
// The map of the code goes stale one rename at a time. This test reads the page, takes every
// code name it writes in backticks (outside fenced blocks) and fails naming each one the
// sources under `src/` no longer define:
// - a file (`target_round.rs`, `arch/family.rs`) or folder (`kernels/`): a file or folder of
//   that name under `src/` (or `tests/`, for the integration tests' files); a path that starts
//   at the repository's root (`src/lib.rs`, `tests/common/`, `scripts/test`) must exist there;
// - a path (`verifier::forward`, `draft::LoadedDrafter`, `attention/tree`): where its leading
//   segments name a module of the library, the last segment must be defined in that module's
//   files; otherwise anywhere, as below;
// - a CamelCase name: a `struct`, `enum`, `trait`, `type` or `union` of that name, an enum
//   variant, or a name the code reads from files (a string literal, e.g. a Hugging Face
//   architecture);
// - a snake_case name: a `fn`, `mod`, `const`, `static`, a field, a file or folder, a string
//   literal (a key read from a file), or a crate the code names (`tokio::`).
// Backticked text that is not a code name is skipped: anything with spaces or other
// punctuation, CLI flags, dotted config keys, URLs, numbers, Rust keywords. A name from
// outside the code that the code never spells goes unquoted in the page.

/// Every file under `src/` and `tests/`, relative to the repository root, with its text.
fn code_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk_all(&root.join("src"), &mut files);
    walk_all(&root.join("tests"), &mut files);
    files
        .into_iter()
        .map(|p| {
            let mut rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if p.is_dir() {
                rel.push('/');
            }
            let text = if rel.ends_with(".rs") {
                std::fs::read_to_string(&p).unwrap_or_default()
            } else {
                String::new()
            };
            (rel, text)
        })
        .collect()
}

fn walk_all(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.push(path.clone());
            walk_all(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The backticked spans of a Markdown text, fenced blocks left out.
fn backticked(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            out.push(inside.to_string());
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(is_ident_char)
}

/// The whole-word occurrences of `name` in `text`, as byte offsets.
fn word_at(text: &str, name: &str) -> Vec<usize> {
    text.match_indices(name)
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = text[..i].chars().next_back();
            let after = text[i + name.len()..].chars().next();
            !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
        })
        .collect()
}

/// Whether `text` defines `name` in a way its case allows (see the comment above).
fn defines(text: &str, name: &str) -> bool {
    let camel = name.starts_with(|c: char| c.is_ascii_uppercase());
    let screaming = !name.chars().any(|c| c.is_ascii_lowercase());
    let items: &[&str] = if camel && screaming {
        // A SCREAMING_CASE name is a constant or a static.
        &["const", "static"]
    } else if camel {
        &["struct", "enum", "trait", "type", "union"]
    } else {
        &[
            "fn",
            "mod",
            "const",
            "static",
            "macro_rules!",
            "struct",
            "enum",
            "trait",
            "type",
        ]
    };
    if text.contains(&format!("\"{name}\"")) {
        return true;
    }
    for i in word_at(text, name) {
        let before = text[..i].trim_end();
        if items.iter().any(|k| {
            before.ends_with(k)
                && !before[..before.len() - k.len()]
                    .chars()
                    .next_back()
                    .is_some_and(is_ident_char)
        }) {
            return true;
        }
        let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
        let lead = text[line_start..i].trim();
        let lead = lead
            .strip_prefix("pub(crate)")
            .or_else(|| lead.strip_prefix("pub(super)"))
            .or_else(|| lead.strip_prefix("pub"))
            .unwrap_or(lead)
            .trim();
        let after = text[i + name.len()..].trim_start_matches(' ');
        if lead.is_empty() {
            // An enum variant (CamelCase) or a field (snake_case) at the start of its line.
            if camel && (after.is_empty() || after.starts_with([',', '(', '{', '=', '\n'])) {
                return true;
            }
            if !camel && after.starts_with(':') && !after.starts_with("::") {
                return true;
            }
        }
        if !camel
            && after.starts_with("::")
            && before.ends_with(|c: char| !is_ident_char(c) && c != ':')
        {
            // A crate or module named at the head of a path (`tokio::spawn`).
            return true;
        }
    }
    false
}

const RUST_KEYWORDS: [&str; 12] = [
    "use", "mod", "fn", "pub", "impl", "struct", "enum", "trait", "type", "self", "super", "crate",
];

/// Why a backticked span is not a name the code has, or `None` when it is (or is no code name).
fn stale(span: &str, files: &[(String, String)]) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exists_suffix = |suffix: &str| {
        files.iter().any(|(f, _)| {
            f.ends_with(&format!("/{suffix}")) && (f.starts_with("src/") || f.starts_with("tests/"))
        })
    };
    let path_chars = |s: &str| {
        s.chars()
            .all(|c| is_ident_char(c) || matches!(c, '/' | '.' | '-'))
    };
    if span.starts_with('/') || span.starts_with("target/") {
        // A URL path (`/metrics`) or a build output.
        return None;
    }
    // Files and folders.
    if path_chars(span)
        && (span.ends_with(".rs") || span.ends_with('/') || span.contains('/'))
        && !span.contains("::")
    {
        let top = span.split('/').next().unwrap();
        if [
            "src",
            "tests",
            "scripts",
            "deploy",
            "dashboards",
            "docs",
            "config",
            "data",
            "heads",
        ]
        .contains(&top)
        {
            return (!root.join(span.trim_end_matches('/')).exists())
                .then(|| format!("`{span}`: no such path"));
        }
        if span.ends_with(".rs") || span.ends_with('/') {
            return (!exists_suffix(span))
                .then(|| format!("`{span}`: no such file or folder under src/ or tests/"));
        }
        if span.contains('.') {
            return None;
        }
        // A module written as a path (`attention/tree`): a file or a folder.
        return (!exists_suffix(&format!("{span}.rs")) && !exists_suffix(&format!("{span}/")))
            .then(|| format!("`{span}`: no such module"));
    }
    // Rust paths and names, with `()` after a function allowed; `a/b::C` read as `a::b::C`.
    let name = span.trim_end_matches("()").replace('/', "::");
    let segments: Vec<&str> = name.split("::").collect();
    if !segments.iter().all(|s| is_ident(s)) || RUST_KEYWORDS.contains(&name.as_str()) {
        return None;
    }
    let last = *segments.last().unwrap();
    if segments.len() > 1
        && segments[..segments.len() - 1]
            .iter()
            .all(|s| s.starts_with(|c: char| c.is_ascii_lowercase()))
    {
        // Leading segments that name a module: the last one must be defined in that module.
        let module = segments[..segments.len() - 1].join("/");
        let in_module: Vec<&(String, String)> = files
            .iter()
            .filter(|(f, _)| {
                f.starts_with("src/")
                    && (f.ends_with(&format!("/{module}.rs")) || f.contains(&format!("/{module}/")))
            })
            .collect();
        if !in_module.is_empty() {
            let found = in_module.iter().any(|(f, text)| {
                defines(text, last)
                    || f.ends_with(&format!("/{module}/{last}.rs"))
                    || f.ends_with(&format!("/{module}/{last}/"))
            });
            return (!found).then(|| format!("`{span}`: `{last}` is not defined in {module}"));
        }
    }
    let found = files.iter().any(|(f, text)| {
        (f.starts_with("src/") && defines(text, last))
            || f.ends_with(&format!("/{last}.rs"))
            || f.ends_with(&format!("/{last}/"))
    });
    (!found).then(|| format!("`{span}`: no `{last}` in the sources"))
}

#[test]
fn architecture_doc_names_only_what_the_code_has() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let files = code_files();
    let mut seen = BTreeSet::new();
    let stale: Vec<String> = backticked(&doc)
        .into_iter()
        .filter(|s| seen.insert(s.clone()))
        .filter_map(|s| stale(&s, &files))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/architecture.md names what the code no longer has:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_doc_check_sees_stale_names() {
    let files = code_files();
    for gone in [
        "NoSuchTypeAnywhere",
        "verifier::no_such_fn",
        "no_such_file.rs",
        "engine/no_such_folder/",
    ] {
        assert!(stale(gone, &files).is_some(), "{gone} should be stale");
    }
    for here in [
        "Scheduler",
        "target_round.rs",
        "scheduler/",
        "Lenience::try_from",
        "--flag",
        "a.b.c",
        "1 + w",
    ] {
        assert!(
            stale(here, &files).is_none(),
            "{here} should pass: {:?}",
            stale(here, &files)
        );
    }
}
