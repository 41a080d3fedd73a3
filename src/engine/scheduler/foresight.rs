//! Which kind of draft a round will get, told before the drafter is asked: the governor plans
//! γ with the acceptance of that kind of draft, not with the average of every kind.
//!
//! Prompt lookup's drafts stand far more often after a long match than after a 1-token one,
//! and a head drafting after prompt lookup (`head+lookup`) mixes lookup's copied drafts with
//! the head's own: one rate for all of them plans every round as if it were the average one,
//! too short where the text is copied and too long where it is not. The scan that finds the
//! match is the drafter's own, pure and cheap next to a forward, so the scheduler runs it too;
//! across requests (`suffix`) it reads the drafter's store of earlier requests as well.

use crate::draft::{read_history, PromptLookup, Rehearsal, SharedHistory};

/// What the scheduler can tell of a sequence's next draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextDraft {
    /// Not known before drafting (a drafter with one kind of draft, or drafts made ahead).
    Unknown,
    /// A draft of this kind (`Proposal::confidence_kind`); kind 0 from a drafter that drafts
    /// lookup's match first means its model drafts, whatever the text matches.
    Kind(u8),
    /// Nothing to draft: prompt lookup alone, and the text has no match.
    Nothing,
}

/// How a drafter that drafts prompt lookup's match first chooses its draft.
#[derive(Clone, Debug)]
pub struct DraftForesight {
    lookup: PromptLookup,
    /// A model (a head) drafts where the text has no match; else nothing is drafted there.
    model_otherwise: bool,
    /// Earlier requests' texts, where lookup looks across requests: the drafter's own store.
    history: Option<SharedHistory>,
}

impl DraftForesight {
    /// How the drafter's lookup would have fared on `prompt` (see [`Rehearsal`]).
    pub fn rehearse(&self, prompt: &[u32]) -> Rehearsal {
        self.lookup.rehearse(prompt)
    }

    /// For a drafter that looks in the request's own text, or alone across requests with the
    /// store `history` it drafts from (`None` without it: the scheduler could not tell what
    /// that drafter finds).
    ///
    /// Without foresight `suffix` was planned with the rate of all its drafts, 1-token matches
    /// and 3-token ones alike: in fresh processes, where its store starts empty and it drafts
    /// as prompt lookup does, it read 1.06x plain on held-out questions where prompt lookup,
    /// foreseen, read 1.25x, and three questions ran below plain.
    pub fn new(
        lookup: PromptLookup,
        model_otherwise: bool,
        history: Option<SharedHistory>,
    ) -> Option<Self> {
        let history = match (lookup.looks_across_requests(), history) {
            (false, _) => None,
            (true, Some(h)) if !model_otherwise => Some(h),
            (true, _) => return None,
        };
        Some(Self {
            lookup,
            model_otherwise,
            history,
        })
    }

    /// Whether a model (a head) drafts where the text has no match: one that takes in nothing
    /// while prompt lookup's match is drafted, and so falls behind the text lookup copies.
    pub fn has_model(&self) -> bool {
        self.model_otherwise
    }

    /// The draft to make after `context`, given what a round of each kind of draft is worth to
    /// the request (`worth`: its expected tokens per step's time, from that kind's acceptance
    /// and what its drafts cost): the match's, unless the model's drafts are worth more than a
    /// match of that length (a 1-token match is right less often than a head).
    pub fn next(&self, context: &[u32], worth: impl Fn(u8) -> f64) -> NextDraft {
        let kind = match &self.history {
            Some(h) => match read_history(h).match_across(&self.lookup, context, 1) {
                ([], _) => None,
                (_, kind) => Some(kind),
            },
            None => self.lookup.match_kind(context),
        };
        match kind {
            Some(kind) if !self.model_otherwise || worth(kind) >= worth(0) => NextDraft::Kind(kind),
            _ if self.model_otherwise => NextDraft::Kind(0),
            _ => NextDraft::Nothing,
        }
    }
}

/// Where a plain run of a sequence drafting with prompt lookup alone stops: before the first
/// step whose context has a match of a kind the governor might draft (`PlainRun::until_match`).
/// A 1-token match is found after most tokens, and where the governor declines that kind a run
/// stopping at every match would be no run at all.
#[derive(Clone, Debug)]
pub struct MatchStop {
    foresight: DraftForesight,
    /// `kinds[k]`: stop at a match of kind `k` (a kind beyond them always stops).
    kinds: [bool; 4],
}

impl MatchStop {
    /// `None` for a drafter with a model behind lookup: it drafts whether or not the text
    /// matches, so no run stops only at matches.
    pub fn new(foresight: &DraftForesight, kinds: [bool; 4]) -> Option<Self> {
        (!foresight.model_otherwise).then(|| Self {
            foresight: foresight.clone(),
            kinds,
        })
    }

    /// Whether lookup finds a match of a stopping kind after `context` (in the store of
    /// earlier requests too, where it looks there).
    pub fn stops_at(&self, context: &[u32]) -> bool {
        match self.foresight.next(context, |_| 0.0) {
            NextDraft::Kind(k) => self.kinds.get(usize::from(k)).copied().unwrap_or(true),
            NextDraft::Nothing | NextDraft::Unknown => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::draft::{Proposal, RequestHistory};
    use crate::engine::batch_drafter::BatchDrafter;
    use crate::engine::lookup_drafter::LookupDrafter;
    use crate::engine::messages::DraftItem;
    use crate::sampling::{DraftGate, SamplingParams, SeededRng};

    #[test]
    fn a_run_stops_where_lookup_alone_finds_a_match_of_a_stopping_kind() {
        let lookup = PromptLookup::new(1, 3);
        let alone = DraftForesight::new(lookup, false, None).expect("own text");
        let first = DraftForesight::new(lookup, true, None).expect("own text");
        assert!(
            MatchStop::new(&first, [true; 4]).is_none(),
            "a model drafts either way"
        );
        let every = MatchStop::new(&alone, [true; 4]).unwrap();
        let long_only = MatchStop::new(&alone, [false, false, false, true]).unwrap();
        let mut p = Proposal::default();
        let cases: [&[u32]; 4] = [
            &[1, 2, 3, 4, 1, 2, 3],
            &[1, 2, 3, 4, 9, 8, 3],
            &[5],
            &[1, 2, 3],
        ];
        for context in cases {
            lookup.lookup_tree(context, 4, 0, &mut p);
            let found = !p.tokens.is_empty();
            assert_eq!(every.stops_at(context), found, "{context:?}");
            let long = found && p.confidence_kind == 3;
            assert_eq!(long_only.stops_at(context), long, "{context:?}");
        }
        assert!(long_only.stops_at(&[1, 2, 3, 4, 1, 2, 3]));
        assert!(
            !long_only.stops_at(&[1, 2, 3, 4, 9, 8, 3]),
            "a 1-token match"
        );
    }

    #[test]
    fn the_foresight_names_the_kind_the_drafter_then_drafts() {
        let lookup = PromptLookup::new(1, 3);
        let alone = DraftForesight::new(lookup, false, None).expect("own text");
        let first = DraftForesight::new(lookup, true, None).expect("own text");
        let cases: [&[u32]; 5] = [
            &[1, 2, 3, 4, 1, 2, 3],
            &[1, 2, 3, 4, 9, 2, 3],
            &[1, 2, 3, 4, 9, 8, 3],
            &[1, 2, 3, 4, 9, 8, 7],
            &[5],
        ];
        let even = |_: u8| 1.2;
        let mut p = Proposal::default();
        for context in cases {
            lookup.lookup_tree(context, 4, 0, &mut p);
            let want = if p.tokens.is_empty() {
                assert_eq!(alone.next(context, even), NextDraft::Nothing, "{context:?}");
                NextDraft::Kind(0)
            } else {
                assert_eq!(
                    alone.next(context, even),
                    NextDraft::Kind(p.confidence_kind)
                );
                NextDraft::Kind(p.confidence_kind)
            };
            assert_eq!(first.next(context, even), want, "{context:?}");
        }
        assert_eq!(alone.next(cases[0], even), NextDraft::Kind(3));
        assert_eq!(alone.next(cases[1], even), NextDraft::Kind(2));
        assert_eq!(alone.next(cases[2], even), NextDraft::Kind(1));
        // Where the model's drafts are worth more than a match of that length, the model
        // drafts (with lookup alone, the match still does: there is nothing else).
        let short_matches_fail = |k: u8| [1.2, 0.9, 1.4, 1.8][usize::from(k)];
        assert_eq!(first.next(cases[2], short_matches_fail), NextDraft::Kind(0));
        assert_eq!(first.next(cases[1], short_matches_fail), NextDraft::Kind(2));
        assert_eq!(first.next(cases[0], short_matches_fail), NextDraft::Kind(3));
        assert_eq!(alone.next(cases[2], short_matches_fail), NextDraft::Kind(1));
        let across = lookup.across_requests();
        let store = RequestHistory::shared_for(across);
        assert!(DraftForesight::new(across, false, None).is_none());
        assert!(DraftForesight::new(across, true, store).is_none());
    }

    #[test]
    fn across_requests_the_foresight_names_the_kind_the_store_gives() {
        let lookup = PromptLookup::new(1, 3).across_requests();
        let store = RequestHistory::shared_for(lookup).expect("across requests");
        let foresight = DraftForesight::new(lookup, false, Some(Arc::clone(&store))).unwrap();
        let mut drafter = LookupDrafter::new(lookup, Some(Arc::clone(&store)));
        let even = |_: u8| 1.2;
        // Nothing in the own text nor the store; then an earlier request had 7 8 9 after 5 6.
        let context = [1, 2, 5, 6];
        assert_eq!(foresight.next(&context, even), NextDraft::Nothing);
        drafter.end(0, false, &[4, 5, 6, 7, 8, 9]);
        let cases: [&[u32]; 4] = [&[1, 2, 5, 6], &[1, 2, 9, 6], &[5, 6, 1, 5, 6], &[3]];
        for context in cases {
            let drafted = drafter.draft(vec![greedy(context)]).outcomes.remove(0);
            let p = drafted.proposal.expect("lookup drafts");
            let want = match p.tokens.is_empty() {
                true => NextDraft::Nothing,
                false => NextDraft::Kind(p.confidence_kind),
            };
            assert_eq!(foresight.next(context, even), want, "{context:?}");
        }
        // The store's 2-token match, and the own text's at equal length.
        assert_eq!(foresight.next(cases[0], even), NextDraft::Kind(2));
        assert_eq!(foresight.next(cases[1], even), NextDraft::Kind(1));
        assert_eq!(foresight.next(cases[2], even), NextDraft::Kind(2));
        assert_eq!(foresight.next(cases[3], even), NextDraft::Nothing);
    }

    /// A greedy 3-token draft request after `context`.
    fn greedy(context: &[u32]) -> DraftItem {
        DraftItem {
            seq: 1,
            scope: 0,
            context: context.to_vec(),
            prompt_len: context.len(),
            gamma: 3,
            params: SamplingParams::greedy(),
            rng: SeededRng::new(0),
            gate: DraftGate::OFF,
            gate_min: 1,
            confidence: false,
            tree_nodes: 0,
            grammar: None,
            features: Vec::new(),
            lookup: true,
            likeliest: true,
        }
    }
}
