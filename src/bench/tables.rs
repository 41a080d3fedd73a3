//! The benchmark's report in words: the Markdown tables, each mode's drafter, and where a
//! mode's cache state differed from its baseline's.
//!
//! Why it exists: the summaries (`report.rs`) are numbers for `--out`; this is how a person
//! reads them at the terminal.

use super::mode::{Mode, Structured};
use super::report::{RunRecord, SummaryRow};
use crate::draft::DraftSpec;

/// `share of rounds · nodes a tree · share that took an alternative`, or `–` without trees.
fn trees_cell(r: &SummaryRow) -> String {
    match (r.tree_share, r.tree_nodes_per_round, r.tree_branch_share) {
        (Some(share), Some(nodes), Some(branched)) => format!(
            "{:.0}% · {nodes:.1} · {:.0}%",
            share * 100.0,
            branched * 100.0
        ),
        _ => "–".into(),
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".into())
}

/// Says, under the tables, what each mode drafted with, and why a speculative mode that drafted
/// nothing shows 1.00x: the governor forecast no round worth its price (a draft model as costly
/// as the target, say) and decoded plainly, as it must whenever speculation would not pay.
pub fn render_drafters(modes: &[Mode], runs: &[RunRecord], draft_model: &str) -> String {
    let mut out = String::from("Drafters:\n");
    for mode in modes {
        let what = match &mode.drafter {
            None if mode.is_plain() => match mode.structured {
                Structured::Free => "none (plain decoding, the baseline)".to_string(),
                Structured::ToolsPrompt => {
                    "none (plain decoding under the tools' system prompt, no constraint)".into()
                }
                _ => "none (constrained plain decoding, the baseline of its structure)".to_string(),
            },
            None => "none: only the constraint's forced tokens are drafted".into(),
            Some(DraftSpec::PromptLookup(p)) => {
                let (lo, hi) = p.ngrams();
                let kind = if p.looks_across_requests() {
                    "suffix: prompt lookup in the request's own text and earlier requests'"
                } else {
                    "prompt lookup in the request's own text"
                };
                format!("{kind}, n-grams of {lo}-{hi} tokens")
            }
            Some(DraftSpec::LookupThen(p, _)) => {
                let (lo, hi) = p.ngrams();
                format!(
                    "prompt lookup in the request's own text (n-grams of {lo}-{hi} tokens), and \
                     where it has no match the draft model {draft_model}"
                )
            }
            Some(DraftSpec::Head { lookup: None, .. }) => {
                "a draft head on the target's own hidden states (--head)".into()
            }
            Some(DraftSpec::Head {
                lookup: Some(p), ..
            }) => {
                let (lo, hi) = p.ngrams();
                format!(
                    "prompt lookup in the request's own text (n-grams of {lo}-{hi} tokens), and \
                     where it has no match the draft head (--head)"
                )
            }
            Some(_) => format!("the draft model {draft_model}"),
        };
        let drafted: usize = runs
            .iter()
            .filter(|r| r.mode == mode.label)
            .map(|r| r.draft_tokens)
            .sum();
        let note = match mode.drafter {
            _ if mode.is_plain() || drafted > 0 => "",
            Some(DraftSpec::PromptLookup(_)) | None => {
                " -- never drafted: no earlier text matched, or no draft was forecast to pay"
            }
            Some(_) => {
                " -- never drafted: not forecast to pay (the governor decoded plainly; see \
                 docs/speculation.md)"
            }
        };
        out.push_str(&format!("- {}: {what}{note}\n", mode.label));
    }
    out
}

/// Says, under the tables, where a mode's first turns found a different share of their prompt
/// in the prefix cache than its baseline's did: its end-to-end speedup then counts prefill it
/// did not do (or did twice); decode speeds are unaffected. Empty when every mode's share
/// matched within 5 points (every batch starts cold unless a shared system prompt is kept).
pub fn render_cache_notes(modes: &[Mode], runs: &[RunRecord]) -> String {
    let first_turn_share = |label: &str| {
        let (cached, prompt) = runs
            .iter()
            .filter(|r| r.mode == label && r.turn == 0)
            .fold((0usize, 0usize), |(c, p), r| {
                (c + r.cached_tokens, p + r.prompt_tokens)
            });
        (prompt > 0).then(|| cached as f64 / prompt as f64)
    };
    let mut out = String::new();
    for mode in modes {
        let Some(base) = mode.baseline(modes) else {
            continue;
        };
        if let (Some(m), Some(b)) = (first_turn_share(&mode.label), first_turn_share(&base.label)) {
            if (m - b).abs() > 0.05 {
                out.push_str(&format!(
                    "- {}: {:.0}% of its first turns' prompt tokens came from the prefix cache, \
                     {:.0}% of {}'s: its speedup (prefill included) is not like for like; \
                     compare decode speeds\n",
                    mode.label,
                    m * 100.0,
                    b * 100.0,
                    base.label
                ));
            }
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("Cache state differed:\n{out}")
    }
}

/// Markdown tables, one per category and one overall.
pub fn render_tables(rows: &[SummaryRow], repeats: usize) -> String {
    let mut out = String::new();
    let mut categories: Vec<&str> = Vec::new();
    for r in rows {
        if !categories.contains(&r.category.as_str()) {
            categories.push(&r.category);
        }
    }
    for c in categories {
        out.push_str(&format!("\n### {c}\n\n"));
        out.push_str(
            "| mode | tok/s | spread | speedup | speedup spread | decode tok/s | decode speedup | acceptance | tokens/round | trees | forced | TTFT | later-turn TTFT | prompt cached | outputs match |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in rows.iter().filter(|r| r.category == c) {
            let s = &r.tokens_per_s;
            let spread = if repeats > 1 {
                format!("{:.1}–{:.1}", s.min, s.max)
            } else {
                "–".into()
            };
            let speedup_spread = match (&r.speedup, repeats > 1) {
                (Some(x), true) => format!("{:.2}–{:.2}x", x.min, x.max),
                _ => "–".into(),
            };
            out.push_str(&format!(
                "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.mode,
                s.median,
                spread,
                opt(r.speedup.map(|x| x.median), |v| format!("{v:.2}x")),
                speedup_spread,
                opt(r.decode_tokens_per_s, |v| format!("{v:.1}")),
                opt(r.decode_speedup, |v| format!("{v:.2}x")),
                opt(r.acceptance_rate, |v| format!("{:.0}%", v * 100.0)),
                opt(r.mean_accepted_length, |v| format!("{v:.2}")),
                trees_cell(r),
                opt(r.forced_share, |v| format!("{:.0}%", v * 100.0)),
                opt(r.ttft_median_s, |v| format!("{:.0} ms", v * 1000.0)),
                opt(r.ttft_later_turns_median_s, |v| format!(
                    "{:.0} ms",
                    v * 1000.0
                )),
                opt(r.cached_share, |v| format!("{:.0}%", v * 100.0)),
                match r.outputs_match {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "–",
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::mode::parse_modes;
    use crate::bench::report::tests::run;

    #[test]
    fn a_mode_whose_cache_state_differed_from_its_baseline_says_so() {
        let modes = parse_modes("plain,pld", 8, &Default::default()).unwrap();
        let mut runs = vec![run("plain", "a", 0, 0, 0), run("pld", "a", 10, 5, 4)];
        runs[0].cached_tokens = 0;
        runs[1].cached_tokens = 9;
        let note = render_cache_notes(&modes, &runs);
        assert!(
            note.contains("- pld: 90%") && note.contains("0% of plain's"),
            "{note}"
        );
        runs[1].cached_tokens = 0;
        assert_eq!(render_cache_notes(&modes, &runs), "");
    }
}
