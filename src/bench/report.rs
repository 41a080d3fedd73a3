//! What a benchmark measured, and the summaries drawn from it.
//!
//! Why it exists: the raw figures (every request, every batch) go to `--out` as they are, and
//! the tables are pure functions of them, so anyone can recompute a table from the JSON.

use serde::Serialize;

use super::mode::Mode;

/// One request (one turn of one question) under one mode.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    pub mode: String,
    pub question_id: i64,
    pub category: String,
    pub repeat: usize,
    pub turn: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// From submission to the last token.
    pub seconds: f64,
    /// From submission to the first token.
    pub ttft_s: f64,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
    pub rounds: usize,
    /// Rounds verified as token trees, their drafted nodes, and those that took an
    /// alternative over the drafted chain.
    pub tree_rounds: usize,
    pub tree_nodes: usize,
    pub tree_branch_accepts: usize,
    /// Drafts a constraint's grammar forced (in `draft_tokens` too), and those that stood.
    pub forced_tokens: usize,
    pub forced_accepted: usize,
    pub finish: String,
    /// Greedy runs: whether the tokens equal plain decoding's for the same question, repeat
    /// and turn. `None` for sampled runs and for plain decoding itself.
    pub outputs_match: Option<bool>,
    /// FNV-1a of the output token ids: runs of two builds or machines compare outputs by it.
    pub output_digest: String,
    #[serde(skip)]
    pub tokens: Vec<u32>,
}

/// A short fingerprint of an output's token ids (64-bit FNV-1a, hex).
pub fn token_digest(tokens: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Requests of one mode run together (`concurrency` at a time), with the wall time they took.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRecord {
    pub mode: String,
    pub category: String,
    pub repeat: usize,
    pub requests: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// A spread of per-repeat figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// One line of a table: a mode in a category (or `overall`).
#[derive(Clone, Debug, Serialize)]
pub struct SummaryRow {
    pub mode: String,
    pub category: String,
    pub requests: usize,
    pub tokens: usize,
    /// Tokens over wall time, prefill included (what a user waits for), per repeat.
    pub tokens_per_s: Spread,
    /// Against the mode's baseline in the same repeats (`Mode::baseline`: plain decoding
    /// under the same structure; for constrained plain decoding, free plain decoding); `None`
    /// for a baseline itself.
    pub speedup: Option<Spread>,
    /// After the first token: (tokens − 1) over (time − TTFT), pooled over the requests.
    pub decode_tokens_per_s: Option<f64>,
    /// `decode_tokens_per_s` over plain decoding's.
    pub decode_speedup: Option<f64>,
    pub acceptance_rate: Option<f64>,
    /// Tokens per speculative round (accepted drafts + 1).
    pub mean_accepted_length: Option<f64>,
    /// Token trees: the share of speculative rounds verified as trees, their mean size in
    /// drafted nodes, and the share of them whose accepted path took an alternative.
    pub tree_share: Option<f64>,
    pub tree_nodes_per_round: Option<f64>,
    pub tree_branch_share: Option<f64>,
    /// The share of drafted tokens a constraint's grammar forced.
    pub forced_share: Option<f64>,
    /// Median time to first token of first turns, and of later turns (whose prompts hold the
    /// conversation so far: what a prefix cache shortens).
    pub ttft_median_s: Option<f64>,
    pub ttft_later_turns_median_s: Option<f64>,
    /// Share of prompt tokens taken from the prefix cache.
    pub cached_share: Option<f64>,
    pub outputs_match: Option<bool>,
}

pub const OVERALL: &str = "overall";

/// Tokens per second of each repeat, over the batches that pass `keep`.
fn per_repeat_rate(
    batches: &[BatchRecord],
    repeats: usize,
    keep: impl Fn(&BatchRecord) -> bool,
) -> Vec<f64> {
    (0..repeats)
        .filter_map(|r| {
            let (tokens, secs) = batches
                .iter()
                .filter(|b| b.repeat == r && keep(b))
                .fold((0usize, 0.0f64), |(t, s), b| (t + b.tokens, s + b.seconds));
            (secs > 0.0).then(|| tokens as f64 / secs)
        })
        .collect()
}

/// Rows for every mode in every category, then `overall`, in the given category order.
pub fn summarize(
    modes: &[Mode],
    categories: &[String],
    runs: &[RunRecord],
    batches: &[BatchRecord],
    repeats: usize,
) -> Vec<SummaryRow> {
    let mut rows = Vec::new();
    let scopes = categories
        .iter()
        .map(String::as_str)
        .chain([OVERALL])
        .collect::<Vec<_>>();
    for name in scopes {
        let scope = Scope {
            name,
            runs,
            batches,
            repeats,
        };
        rows.extend(modes.iter().filter_map(|mode| scope.row(mode, modes)));
    }
    rows
}

/// The figures of one category (or `overall`) that its rows are drawn from.
struct Scope<'a> {
    name: &'a str,
    runs: &'a [RunRecord],
    batches: &'a [BatchRecord],
    repeats: usize,
}

impl Scope<'_> {
    fn includes(&self, category: &str) -> bool {
        self.name == OVERALL || category == self.name
    }

    /// Tokens per second of each repeat of the mode labelled `label`.
    fn rates(&self, label: &str) -> Vec<f64> {
        per_repeat_rate(self.batches, self.repeats, |b| {
            b.mode == label && self.includes(&b.category)
        })
    }

    /// After the first token: (tokens − 1) over (time − TTFT), pooled over the mode's requests.
    fn decode_rate(&self, label: &str) -> Option<f64> {
        let (t, secs) = self
            .runs
            .iter()
            .filter(|r| r.mode == label && self.includes(&r.category))
            .fold((0usize, 0.0f64), |(t, s), r| {
                (
                    t + r.completion_tokens.saturating_sub(1),
                    s + (r.seconds - r.ttft_s),
                )
            });
        (secs > 0.0).then(|| t as f64 / secs)
    }

    /// The mode's row (`None`: it ran no batch here), measured against its baseline.
    fn row(&self, mode: &Mode, modes: &[Mode]) -> Option<SummaryRow> {
        let plain = mode.baseline(modes).map(|m| m.label.clone());
        let rates = self.rates(&mode.label);
        let tokens_per_s = Spread::of(&rates)?;
        let speedup = match &plain {
            Some(p) if &mode.label != p => {
                let base = self.rates(p);
                let ratios: Vec<f64> = rates
                    .iter()
                    .zip(&base)
                    .filter(|(_, b)| **b > 0.0)
                    .map(|(r, b)| r / b)
                    .collect();
                Spread::of(&ratios)
            }
            _ => None,
        };
        let mine: Vec<&RunRecord> = self
            .runs
            .iter()
            .filter(|r| r.mode == mode.label && self.includes(&r.category))
            .collect();
        let decode_tokens_per_s = self.decode_rate(&mode.label);
        let decode_speedup = match (&plain, decode_tokens_per_s) {
            (Some(p), Some(d)) if &mode.label != p => self.decode_rate(p).map(|b| d / b),
            _ => None,
        };
        let t = Totals::of(&mine);
        let per_tree = |x: usize| (t.tree_rounds > 0).then(|| x as f64 / t.tree_rounds as f64);
        let matches: Vec<bool> = mine.iter().filter_map(|r| r.outputs_match).collect();
        Some(SummaryRow {
            mode: mode.label.clone(),
            category: self.name.to_string(),
            requests: mine.len(),
            tokens: t.completion_tokens,
            tokens_per_s,
            speedup,
            decode_tokens_per_s,
            decode_speedup,
            acceptance_rate: (t.drafted > 0).then(|| t.accepted as f64 / t.drafted as f64),
            mean_accepted_length: (t.rounds > 0).then(|| 1.0 + t.accepted as f64 / t.rounds as f64),
            tree_share: (t.rounds > 0).then(|| t.tree_rounds as f64 / t.rounds as f64),
            tree_nodes_per_round: per_tree(t.tree_nodes),
            tree_branch_share: per_tree(t.branched),
            forced_share: (t.drafted > 0 && mode.structured.is_constrained())
                .then(|| t.forced as f64 / t.drafted as f64),
            ttft_median_s: median_ttft(&mine, true),
            ttft_later_turns_median_s: median_ttft(&mine, false),
            cached_share: (t.prompt_tokens > 0)
                .then(|| t.cached_tokens as f64 / t.prompt_tokens as f64),
            outputs_match: (!matches.is_empty()).then(|| matches.iter().all(|&m| m)),
        })
    }
}

/// A mode's requests in one scope, added up.
struct Totals {
    completion_tokens: usize,
    drafted: usize,
    accepted: usize,
    rounds: usize,
    tree_rounds: usize,
    tree_nodes: usize,
    branched: usize,
    forced: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
}

impl Totals {
    fn of(mine: &[&RunRecord]) -> Totals {
        let sum = |field: fn(&RunRecord) -> usize| mine.iter().map(|r| field(r)).sum();
        Totals {
            completion_tokens: sum(|r| r.completion_tokens),
            drafted: sum(|r| r.draft_tokens),
            accepted: sum(|r| r.accepted_tokens),
            rounds: sum(|r| r.rounds),
            tree_rounds: sum(|r| r.tree_rounds),
            tree_nodes: sum(|r| r.tree_nodes),
            branched: sum(|r| r.tree_branch_accepts),
            forced: sum(|r| r.forced_tokens),
            prompt_tokens: sum(|r| r.prompt_tokens),
            cached_tokens: sum(|r| r.cached_tokens),
        }
    }
}

/// The median time to first token of first turns (`first`) or of later ones.
fn median_ttft(mine: &[&RunRecord], first: bool) -> Option<f64> {
    let mut t: Vec<f64> = mine
        .iter()
        .filter(|r| (r.turn == 0) == first)
        .map(|r| r.ttft_s)
        .collect();
    t.sort_by(f64::total_cmp);
    Spread::of(&t).map(|s| s.median)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::mode::parse_modes;
    use crate::bench::tables::render_tables;

    pub(crate) fn batch(
        mode: &str,
        category: &str,
        repeat: usize,
        tokens: usize,
        seconds: f64,
    ) -> BatchRecord {
        BatchRecord {
            mode: mode.into(),
            category: category.into(),
            repeat,
            requests: 1,
            tokens,
            seconds,
        }
    }

    pub(crate) fn run(
        mode: &str,
        category: &str,
        drafted: usize,
        accepted: usize,
        rounds: usize,
    ) -> RunRecord {
        RunRecord {
            mode: mode.into(),
            question_id: 1,
            category: category.into(),
            repeat: 0,
            turn: 0,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 10,
            seconds: 1.0,
            ttft_s: 0.1,
            draft_tokens: drafted,
            accepted_tokens: accepted,
            rounds,
            tree_rounds: 0,
            tree_nodes: 0,
            tree_branch_accepts: 0,
            forced_tokens: 0,
            forced_accepted: 0,
            finish: "length".into(),
            outputs_match: (mode != "plain").then_some(true),
            output_digest: token_digest(&[]),
            tokens: vec![],
        }
    }

    #[test]
    fn speedups_are_per_repeat_ratios_and_overall_pools_categories() {
        let modes = parse_modes("plain,pld", 8, &Default::default()).unwrap();
        let cats = vec!["a".to_string(), "b".to_string()];
        let batches = vec![
            batch("plain", "a", 0, 100, 1.0),
            batch("pld", "a", 0, 100, 0.5),
            batch("plain", "b", 0, 100, 1.0),
            batch("pld", "b", 0, 100, 1.0),
            batch("plain", "a", 1, 100, 2.0),
            batch("pld", "a", 1, 100, 0.5),
            batch("plain", "b", 1, 100, 1.0),
            batch("pld", "b", 1, 100, 1.0),
        ];
        let runs = vec![run("plain", "a", 0, 0, 0), run("pld", "a", 10, 5, 4)];
        let rows = summarize(&modes, &cats, &runs, &batches, 2);
        let get = |m: &str, c: &str| {
            rows.iter()
                .find(|r| r.mode == m && r.category == c)
                .unwrap()
        };
        let a = get("pld", "a");
        assert_eq!(a.speedup.unwrap().min, 2.0);
        assert_eq!(a.speedup.unwrap().max, 4.0);
        assert_eq!(a.speedup.unwrap().median, 3.0);
        assert_eq!(a.acceptance_rate, Some(0.5));
        assert_eq!(a.mean_accepted_length, Some(1.0 + 5.0 / 4.0));
        assert_eq!(a.outputs_match, Some(true));
        assert_eq!(get("pld", "b").speedup.unwrap().median, 1.0);
        // overall, repeat 0: plain 200 tokens in 2 s, pld 200 in 1.5 s (4/3x); repeat 1:
        // plain 200 in 3 s, pld 200 in 1.5 s (2x).
        let o = get("pld", OVERALL).speedup.unwrap();
        assert!(
            (o.min - 4.0 / 3.0).abs() < 1e-9 && (o.max - 2.0).abs() < 1e-9,
            "{o:?}"
        );
        assert!(get("plain", OVERALL).speedup.is_none());
        assert_eq!(a.cached_share, Some(0.4));
        assert_eq!(a.ttft_later_turns_median_s, None, "first turns only");
        let table = render_tables(&rows, 2);
        assert!(
            table.contains("### overall") && table.contains("| pld | "),
            "{table}"
        );
    }

    #[test]
    fn spreads_take_medians() {
        assert_eq!(Spread::of(&[]), None);
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 2.0]).unwrap().median, 1.5);
    }
}
