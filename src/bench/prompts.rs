//! Spec-Bench prompt files: one JSON object a line, `{"question_id", "category", "turns"}`.
//!
//! Why it exists: a benchmark is only as trustworthy as its input handling; a malformed line
//! must stop the run with the file and line named, not skew it silently.

use std::path::Path;

use serde::Deserialize;

use super::BenchError;

/// One benchmark question: its turns are user messages, answered one after another.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct BenchPrompt {
    pub question_id: i64,
    pub category: String,
    pub turns: Vec<String>,
}

/// Parses a whole prompt file's text; `origin` names it in errors.
pub fn parse_prompts(text: &str, origin: &str) -> Result<Vec<BenchPrompt>, BenchError> {
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| BenchError::Prompts {
            origin: origin.to_string(),
            line: i + 1,
            reason,
        };
        let p: BenchPrompt = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if p.turns.is_empty() || p.turns.iter().any(|t| t.trim().is_empty()) {
            return Err(bad("`turns` must hold at least one non-empty string".into()));
        }
        if p.category.trim().is_empty() {
            return Err(bad("`category` must not be empty".into()));
        }
        prompts.push(p);
    }
    if prompts.is_empty() {
        return Err(BenchError::Prompts {
            origin: origin.to_string(),
            line: 0,
            reason: "the file holds no prompts".into(),
        });
    }
    Ok(prompts)
}

pub fn load_prompts(path: &Path) -> Result<Vec<BenchPrompt>, BenchError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::Prompts {
        origin: origin.clone(),
        line: 0,
        reason: e.to_string(),
    })?;
    parse_prompts(&text, &origin)
}

/// Every `n`-th question of a file (the `n`-th, `2n`-th, …, by place in the file) when
/// `left_out`, else all the others: `tandem train-head --leave-out N` trains on the others, and
/// `tandem bench --left-out N` measures on those it never saw. `n = 0` keeps everything.
pub fn every_nth(prompts: Vec<BenchPrompt>, n: usize, left_out: bool) -> Vec<BenchPrompt> {
    if n == 0 {
        return prompts;
    }
    prompts
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i % n == n - 1) == left_out)
        .map(|(_, p)| p)
        .collect()
}

/// Keeps the prompts of the given categories (all when empty), at most `limit` per category
/// (all when `None`), in file order; categories keep the order of their first appearance.
pub fn select(
    prompts: Vec<BenchPrompt>,
    categories: &[String],
    limit: Option<usize>,
) -> Result<Vec<BenchPrompt>, BenchError> {
    for c in categories {
        if !prompts.iter().any(|p| &p.category == c) {
            let mut known: Vec<&str> = prompts.iter().map(|p| p.category.as_str()).collect();
            known.dedup();
            return Err(BenchError::Options(format!(
                "no prompts of category `{c}` (the file has: {})",
                known.join(", ")
            )));
        }
    }
    let mut order: Vec<String> = Vec::new();
    for p in &prompts {
        if !order.contains(&p.category) {
            order.push(p.category.clone());
        }
    }
    let mut out = Vec::new();
    for c in order {
        if !categories.is_empty() && !categories.contains(&c) {
            continue;
        }
        let of_c = prompts.iter().filter(|p| p.category == c).cloned();
        out.extend(of_c.take(limit.unwrap_or(usize::MAX)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_splits_a_file_in_two() {
        let text: String = (1..=7)
            .map(|i| format!("{{\"question_id\": {i}, \"category\": \"c\", \"turns\": [\"q\"]}}\n"))
            .collect();
        let all = parse_prompts(&text, "t").unwrap();
        let ids = |v: Vec<BenchPrompt>| v.iter().map(|p| p.question_id).collect::<Vec<_>>();
        assert_eq!(ids(every_nth(all.clone(), 3, true)), [3, 6]);
        assert_eq!(ids(every_nth(all.clone(), 3, false)), [1, 2, 4, 5, 7]);
        assert_eq!(ids(every_nth(all, 0, true)).len(), 7);
    }

    const GOOD: &str = r#"{"question_id": 1, "category": "writing", "turns": ["a", "b"]}
{"question_id": 2, "category": "qa", "turns": ["c"]}

{"question_id": 3, "category": "writing", "turns": ["d"]}
"#;

    #[test]
    fn good_files_parse_and_select_by_category_and_limit() {
        let p = parse_prompts(GOOD, "f").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].turns, vec!["a", "b"]);
        let s = select(p.clone(), &[], Some(1)).unwrap();
        let ids: Vec<i64> = s.iter().map(|p| p.question_id).collect();
        assert_eq!(ids, vec![1, 2]);
        let s = select(p.clone(), &["writing".into()], None).unwrap();
        assert_eq!(s.len(), 2);
        let e = select(p, &["poetry".into()], None).unwrap_err();
        assert!(
            e.to_string().contains("poetry") && e.to_string().contains("writing"),
            "{e}"
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let bad_json = "{\"question_id\": 1, \"category\": \"x\", \"turns\": [\"a\"]}\n{oops\n";
        let e = parse_prompts(bad_json, "p.jsonl").unwrap_err();
        assert!(e.to_string().contains("p.jsonl:2"), "{e}");
        let missing = "{\"question_id\": 1, \"turns\": [\"a\"]}";
        let e = parse_prompts(missing, "p.jsonl").unwrap_err();
        assert!(
            e.to_string().contains("p.jsonl:1") && e.to_string().contains("category"),
            "{e}"
        );
        let no_turns = "{\"question_id\": 1, \"category\": \"x\", \"turns\": []}";
        let e = parse_prompts(no_turns, "p.jsonl").unwrap_err();
        assert!(e.to_string().contains("turns"), "{e}");
        let e = parse_prompts("\n\n", "empty.jsonl").unwrap_err();
        assert!(e.to_string().contains("no prompts"), "{e}");
    }
}
