//! How much of the target's own text a drafter of another vocabulary can propose: the share
//! of plain decoding's output tokens that the two vocabularies share, per category.
//!
//! Why it exists: a drafter drafting over the shared tokens alone (token-level intersection)
//! ends every accepted run at the first token it cannot propose, so this share bounds what it
//! can give on each kind of text; the report puts it beside the acceptance it got.

use std::collections::BTreeMap;

use super::mode::Mode;
use super::report::{RunRecord, OVERALL};
use crate::draft::Translation;

/// Per category (and overall): the plain runs' output tokens the drafter could propose.
pub fn render_coverage(translation: &Translation, modes: &[Mode], runs: &[RunRecord]) -> String {
    let plain: Vec<&str> = modes
        .iter()
        .filter(|m| m.is_plain())
        .map(|m| m.label.as_str())
        .collect();
    let mut by_category: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for r in runs.iter().filter(|r| plain.contains(&r.mode.as_str())) {
        let covered = translation.coverage(&r.tokens) * r.tokens.len() as f64;
        for key in [r.category.as_str(), OVERALL] {
            let e = by_category.entry(key).or_default();
            e.0 += covered;
            e.1 += r.tokens.len();
        }
    }
    let mut out = format!(
        "drafting across vocabularies: {} shared tokens; the share of plain decoding's output \
         tokens they cover\n\n| category | tokens | covered |\n|---|---|---|\n",
        translation.shared()
    );
    let overall = by_category.remove(OVERALL);
    for (category, (covered, n)) in by_category.into_iter().chain(overall.map(|o| (OVERALL, o))) {
        let share = if n == 0 { 0.0 } else { covered / n as f64 };
        out.push_str(&format!("| {category} | {n} | {:.1}% |\n", share * 100.0));
    }
    out
}
