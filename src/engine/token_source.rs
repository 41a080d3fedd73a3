//! Who wrote each output token (token provenance), gathered into runs of text.
//!
//! Why it exists: a client that asks (`"speculative": {"token_sources": true}`) is told, run by
//! run, which text the target wrote itself, which came from an accepted draft (and which
//! drafter's), which a grammar forced, and which the target wrote in place of a rejected
//! draft. A round's tokens are known in order (accepted drafts, then the target's token), so
//! their sources are a pure function of the round's counts; the text each token released is
//! the emitter's, so the runs' texts concatenate to the output exactly.

use crate::draft::DraftOrigin;

/// The source of one output token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The target's own token: a plain step's, the first after the prompt, or the one a round
    /// adds after all its drafts stood.
    Target,
    /// A draft that stood, and its drafter (`None` only where no drafter is named).
    Draft(Option<DraftOrigin>),
    /// A draft the output's grammar forced that stood.
    Forced,
    /// The target's token in place of a draft the round rejected.
    Correction,
}

impl TokenSource {
    /// The name the API reports (`source` of a run).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Target => "target",
            Self::Draft(_) => "draft",
            Self::Forced => "forced",
            Self::Correction => "correction",
        }
    }

    /// The drafter of a draft.
    pub fn drafter(self) -> Option<DraftOrigin> {
        match self {
            Self::Draft(d) => d,
            _ => None,
        }
    }
}

/// Consecutive output tokens of one source and the text they released.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRun {
    pub source: TokenSource,
    pub text: String,
    /// Tokens in the run (a token whose text is still held back, such as half a character or
    /// a possible stop string, counts in its own run; its text comes with a later token's).
    pub tokens: usize,
}

/// Runs as they are gathered: a token at a time, each joining the run before it when of the
/// same source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceRuns(Vec<SourceRun>);

impl SourceRuns {
    /// One token of `source` that released `text`.
    pub fn push(&mut self, source: TokenSource, text: &str) {
        match self.0.last_mut() {
            Some(last) if last.source == source => {
                last.text.push_str(text);
                last.tokens += 1;
            }
            _ => self.0.push(SourceRun {
                source,
                text: text.to_string(),
                tokens: 1,
            }),
        }
    }

    /// Text released without a token (held-back text at the end): the last run's.
    pub fn push_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(last) => last.text.push_str(text),
            None => self.0.push(SourceRun {
                source: TokenSource::Target,
                text: text.to_string(),
                tokens: 0,
            }),
        }
    }

    /// Later runs, the first joining the last when of the same source.
    pub fn extend(&mut self, runs: Vec<SourceRun>) {
        for run in runs {
            match self.0.last_mut() {
                Some(last) if last.source == run.source => {
                    last.text.push_str(&run.text);
                    last.tokens += run.tokens;
                }
                _ => self.0.push(run),
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[SourceRun] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<SourceRun> {
        self.0
    }
}

/// What a round did, as its tokens' sources need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundShape {
    /// Drafts sent for verification (0: a plain step or the prompt's first token).
    pub drafted: usize,
    /// Drafts that stood, in order.
    pub accepted: usize,
    /// How many of the drafts (the first ones) the grammar forced.
    pub forced: usize,
    /// Every draft the round tried stood (for a chain: `accepted == drafted`; for a tree: its
    /// main chain stood whole), so the target's token is its own, not a correction.
    pub all_stood: bool,
    /// The drafter of the drafts that were not forced.
    pub origin: Option<DraftOrigin>,
}

impl RoundShape {
    /// The sources of the round's tokens in order: its accepted drafts, then the target's token.
    pub fn sources(&self) -> impl Iterator<Item = TokenSource> + '_ {
        let drafts = (0..self.accepted).map(|i| {
            if i < self.forced {
                TokenSource::Forced
            } else {
                TokenSource::Draft(self.origin)
            }
        });
        let last = if self.drafted == 0 || self.all_stood {
            TokenSource::Target
        } else {
            TokenSource::Correction
        };
        drafts.chain([last])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(drafted: usize, accepted: usize, forced: usize) -> RoundShape {
        RoundShape {
            drafted,
            accepted,
            forced,
            all_stood: accepted == drafted,
            origin: Some(DraftOrigin::PromptLookup),
        }
    }

    #[test]
    fn a_rounds_tokens_are_its_drafts_then_the_targets_token() {
        let lookup = TokenSource::Draft(Some(DraftOrigin::PromptLookup));
        let plain: Vec<_> = shape(0, 0, 0).sources().collect();
        assert_eq!(plain, [TokenSource::Target]);
        let rejected: Vec<_> = shape(4, 2, 0).sources().collect();
        assert_eq!(rejected, [lookup, lookup, TokenSource::Correction]);
        let all: Vec<_> = shape(3, 3, 1).sources().collect();
        assert_eq!(
            all,
            [TokenSource::Forced, lookup, lookup, TokenSource::Target]
        );
        let none_stood: Vec<_> = shape(3, 0, 2).sources().collect();
        assert_eq!(none_stood, [TokenSource::Correction]);
    }

    #[test]
    fn runs_join_tokens_of_one_source_and_keep_every_token_and_character() {
        let lookup = TokenSource::Draft(Some(DraftOrigin::Suffix));
        let mut runs = SourceRuns::default();
        runs.push(TokenSource::Target, "Hel");
        runs.push(lookup, "");
        runs.push(lookup, "lo, w");
        runs.push(TokenSource::Correction, "or");
        let mut later = SourceRuns::default();
        later.push(TokenSource::Correction, "ld");
        later.push_text("!");
        runs.extend(later.into_vec());
        let runs = runs.into_vec();
        let text: String = runs.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(text, "Hello, world!");
        assert_eq!(runs.iter().map(|r| r.tokens).sum::<usize>(), 5);
        assert_eq!(
            runs.iter().map(|r| r.source).collect::<Vec<_>>(),
            [TokenSource::Target, lookup, TokenSource::Correction]
        );
    }

    #[test]
    fn text_without_a_token_before_any_run_is_the_targets() {
        let mut runs = SourceRuns::default();
        runs.push_text("");
        assert!(runs.is_empty());
        runs.push_text("x");
        assert_eq!(runs.as_slice()[0].source, TokenSource::Target);
        assert_eq!(runs.as_slice()[0].tokens, 0);
    }
}
