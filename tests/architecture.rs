//! The shape of the library, checked from its sources: layers only point down, and no two
//! files import each other, directly or around a circle.
//!
//! Why it exists: the layering (model, sampling, constraint, draft, engine, server) is what lets each part
//! be tested and replaced alone, and it erodes one convenient `use` at a time. This test reads
//! every `use` of the library's non-test code, resolves it to the file that defines what it
//! names (through re-exports: `super::Llama` is `model/llama/model.rs`, not `model/mod.rs`),
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
    // Through a re-export: `crate::model::Llama` is defined in `model/llama/model.rs`.
    assert!(from("engine/verifier.rs").contains("model/llama/model.rs"));
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
