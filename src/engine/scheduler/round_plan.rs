//! The shape of one round, decided before any work is sent: which decoding sequences are
//! verified now, which draft now for a later round (pipelining), and which prompts get a chunk
//! of the prefill budget. Pure, so the scheduling rules are unit-tested apart from the actors.

/// What the round plan needs to know of one active sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqState {
    /// Its prompt is fully prefilled.
    pub decoding: bool,
    /// It holds drafts made in an earlier round, waiting for verification.
    pub pending: bool,
    /// Pipelining group (0 or 1).
    pub group: usize,
    /// Prompt tokens not yet prefilled.
    pub prompt_left: usize,
    /// It waits for another choice of its request to prefill the prompt: no part in rounds.
    pub waiting: bool,
}

/// A sequence's share of the round's target forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetPart {
    /// Verify its drafts (or take a plain step).
    Verify,
    /// Prefill its next `len` prompt tokens.
    Prefill { len: usize },
}

/// One round's composition; indices point into the scheduler's active sequences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundPlan {
    /// The pipelining group verified this round.
    pub verify_group: usize,
    /// Pipelining within requests: one group decodes, is verified every round, and drafts its
    /// next round during the verification.
    pub within: bool,
    /// Decoding sequences that draft now and are verified in this round's forward.
    pub draft_now: Vec<usize>,
    /// Decoding sequences of the other group that draft during this round's verification.
    pub draft_ahead: Vec<usize>,
    /// The target forward, in the order of the active sequences.
    pub target: Vec<(usize, TargetPart)>,
    /// Prompt tokens in the target forward.
    pub prefill_width: usize,
}

impl RoundPlan {
    /// The round after `rounds` rounds. With `pipelined`, decoding sequences are split into two
    /// groups that alternate while both have decoding sequences: one is verified while the other
    /// drafts. A lone group is verified every round and drafts ahead within its own requests.
    /// Prompts take chunks of at most `prefill_chunk` tokens in all, in order.
    pub fn build(seqs: &[SeqState], pipelined: bool, prefill_chunk: usize, rounds: u64) -> Self {
        let decoding_in = |g: usize| seqs.iter().any(|s| s.decoding && s.group == g);
        let (in_0, in_1) = (decoding_in(0), decoding_in(1));
        let within = pipelined && !(in_0 && in_1);
        let verify_group = if within {
            usize::from(in_1 && !in_0)
        } else {
            (rounds % 2) as usize
        };
        let mut plan = RoundPlan {
            verify_group,
            within,
            ..RoundPlan::default()
        };
        let mut budget = prefill_chunk.max(1);
        for (i, s) in seqs.iter().enumerate() {
            if s.waiting {
                continue;
            }
            if s.decoding {
                // Between groups, the verified group's drafts were made in the round before.
                if !s.pending {
                    if !pipelined || within {
                        plan.draft_now.push(i);
                    } else if s.group != verify_group {
                        plan.draft_ahead.push(i);
                    }
                }
                if !pipelined || s.group == verify_group {
                    plan.target.push((i, TargetPart::Verify));
                }
            } else if budget > 0 {
                let len = s.prompt_left.min(budget);
                budget -= len;
                plan.prefill_width += len;
                plan.target.push((i, TargetPart::Prefill { len }));
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoding(group: usize) -> SeqState {
        SeqState {
            decoding: true,
            pending: false,
            group,
            prompt_left: 0,
            waiting: false,
        }
    }

    fn prompt(left: usize) -> SeqState {
        SeqState {
            decoding: false,
            pending: false,
            group: 0,
            prompt_left: left,
            waiting: false,
        }
    }

    #[test]
    fn without_pipelining_every_decoding_sequence_drafts_and_is_verified() {
        let seqs = [decoding(0), decoding(1), prompt(10)];
        let p = RoundPlan::build(&seqs, false, 512, 7);
        assert_eq!(p.draft_now, vec![0, 1]);
        assert!(p.draft_ahead.is_empty());
        assert_eq!(
            p.target,
            vec![
                (0, TargetPart::Verify),
                (1, TargetPart::Verify),
                (2, TargetPart::Prefill { len: 10 })
            ]
        );
        assert_eq!(p.prefill_width, 10);
    }

    #[test]
    fn pipelined_groups_alternate_one_verified_while_the_other_drafts() {
        let seqs = [decoding(0), decoding(1)];
        let even = RoundPlan::build(&seqs, true, 512, 4);
        assert!(!even.within);
        // The verified group's drafts were made during the round before.
        assert!(even.draft_now.is_empty());
        assert_eq!(even.draft_ahead, vec![1]);
        assert_eq!(even.target, vec![(0, TargetPart::Verify)]);
        let odd = RoundPlan::build(&seqs, true, 512, 5);
        assert!(odd.draft_now.is_empty());
        assert_eq!(odd.draft_ahead, vec![0]);
        assert_eq!(odd.target, vec![(1, TargetPart::Verify)]);
    }

    #[test]
    fn a_lone_group_is_verified_every_round_and_drafts_ahead_within_itself() {
        let seqs = [decoding(1), decoding(1)];
        for rounds in [0, 1] {
            let p = RoundPlan::build(&seqs, true, 512, rounds);
            assert!(p.within);
            assert_eq!(p.verify_group, 1);
            assert_eq!(p.draft_now, vec![0, 1]);
            assert_eq!(p.target.len(), 2);
        }
    }

    #[test]
    fn sequences_with_pending_drafts_are_verified_without_drafting_again() {
        let mut waiting = decoding(0);
        waiting.pending = true;
        let p = RoundPlan::build(&[waiting, decoding(1), decoding(0)], true, 512, 0);
        assert!(
            p.draft_now.is_empty(),
            "the verified group drafted last round"
        );
        assert_eq!(p.draft_ahead, vec![1]);
        assert_eq!(
            p.target,
            vec![(0, TargetPart::Verify), (2, TargetPart::Verify)],
            "one without drafts takes a plain step"
        );
    }

    #[test]
    fn prompts_share_the_prefill_budget_in_order() {
        let seqs = [prompt(300), decoding(0), prompt(300), prompt(5)];
        let p = RoundPlan::build(&seqs, false, 512, 0);
        assert_eq!(
            p.target,
            vec![
                (0, TargetPart::Prefill { len: 300 }),
                (1, TargetPart::Verify),
                (2, TargetPart::Prefill { len: 212 }),
            ]
        );
        assert_eq!(p.prefill_width, 512);
        // A choice waiting for another's prefill takes no part.
        let mut waiting = prompt(300);
        waiting.waiting = true;
        let p = RoundPlan::build(&[waiting, prompt(5)], false, 512, 0);
        assert_eq!(p.target, vec![(1, TargetPart::Prefill { len: 5 })]);
        // A zero budget still moves prompts forward one token at a time.
        let p = RoundPlan::build(&[prompt(3)], false, 0, 0);
        assert_eq!(p.target, vec![(0, TargetPart::Prefill { len: 1 })]);
    }
}
