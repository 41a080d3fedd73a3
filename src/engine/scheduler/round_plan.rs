//! The shape of one round, decided before any work is sent: which decoding sequences are
//! verified now, which draft now for a later round (pipelining), and which prompts get a chunk
//! of the prefill budget. Pure, so the scheduling rules are unit-tested apart from the actors.

use super::prefill_price::PrefillPrice;

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
    /// Prompt tokens already in its cache: where its next chunk starts.
    pub prompt_done: usize,
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
    /// Prompts take chunks, in order, that together cost at most what `prefill_chunk` tokens
    /// cost at a context's start (`price`): a chunk deep in its context is shorter. The first
    /// prompt takes at least one token, so every prompt moves whatever its depth.
    pub fn build(
        seqs: &[SeqState],
        pipelined: bool,
        (price, prefill_chunk): (&PrefillPrice, usize),
        rounds: u64,
    ) -> Self {
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
        let mut budget = price.chunk(0, prefill_chunk.max(1));
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
            } else if budget > 0.0 {
                let (mut len, mut cost) = price.fit(s.prompt_done, s.prompt_left, budget);
                if len == 0 && s.prompt_left > 0 {
                    if plan.prefill_width > 0 {
                        continue;
                    }
                    (len, cost) = (1, price.token(s.prompt_done));
                }
                budget -= cost;
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
            prompt_done: 0,
            waiting: false,
        }
    }

    fn prompt(left: usize) -> SeqState {
        SeqState {
            decoding: false,
            pending: false,
            group: 0,
            prompt_left: left,
            prompt_done: 0,
            waiting: false,
        }
    }

    #[test]
    fn without_pipelining_every_decoding_sequence_drafts_and_is_verified() {
        let seqs = [decoding(0), decoding(1), prompt(10)];
        let p = RoundPlan::build(&seqs, false, (&PrefillPrice::flat(), 512), 7);
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
        let even = RoundPlan::build(&seqs, true, (&PrefillPrice::flat(), 512), 4);
        assert!(!even.within);
        // The verified group's drafts were made during the round before.
        assert!(even.draft_now.is_empty());
        assert_eq!(even.draft_ahead, vec![1]);
        assert_eq!(even.target, vec![(0, TargetPart::Verify)]);
        let odd = RoundPlan::build(&seqs, true, (&PrefillPrice::flat(), 512), 5);
        assert!(odd.draft_now.is_empty());
        assert_eq!(odd.draft_ahead, vec![0]);
        assert_eq!(odd.target, vec![(1, TargetPart::Verify)]);
    }

    #[test]
    fn a_lone_group_is_verified_every_round_and_drafts_ahead_within_itself() {
        let seqs = [decoding(1), decoding(1)];
        for rounds in [0, 1] {
            let p = RoundPlan::build(&seqs, true, (&PrefillPrice::flat(), 512), rounds);
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
        let p = RoundPlan::build(
            &[waiting, decoding(1), decoding(0)],
            true,
            (&PrefillPrice::flat(), 512),
            0,
        );
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
        let p = RoundPlan::build(&seqs, false, (&PrefillPrice::flat(), 512), 0);
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
        let p = RoundPlan::build(
            &[waiting, prompt(5)],
            false,
            (&PrefillPrice::flat(), 512),
            0,
        );
        assert_eq!(p.target, vec![(1, TargetPart::Prefill { len: 5 })]);
        // A zero budget still moves prompts forward one token at a time.
        let p = RoundPlan::build(&[prompt(3)], false, (&PrefillPrice::flat(), 0), 0);
        assert_eq!(p.target, vec![(0, TargetPart::Prefill { len: 1 })]);
    }

    #[test]
    fn deep_prompts_take_shorter_chunks_and_the_first_always_moves() {
        // A token's matmuls cost what 1000 keys cost: at depth 8000 a token costs ~9.
        let price = PrefillPrice::new(1e-3, &[(1e-6, None)]);
        let mut deep = prompt(5000);
        deep.prompt_done = 8000;
        let p = RoundPlan::build(&[decoding(0), deep], false, (&price, 256), 0);
        let Some(&(1, TargetPart::Prefill { len })) = p.target.get(1) else {
            panic!("{:?}", p.target)
        };
        assert!((28..=33).contains(&len), "{len}");
        assert!(price.chunk(8000, len) <= price.chunk(0, 256));
        // A shallow prompt before it takes its share first; the deep one fits in what is left.
        let p = RoundPlan::build(&[prompt(100), deep], false, (&price, 256), 0);
        let Some(&(1, TargetPart::Prefill { len: rest })) = p.target.get(1) else {
            panic!("{:?}", p.target)
        };
        assert!(rest < len && 100 + rest == p.prefill_width, "{rest}");
        assert!(price.chunk(0, 100) + price.chunk(8000, rest) <= price.chunk(0, 256));
        // So deep that one token is over the budget: it still takes one, alone.
        deep.prompt_done = 1_000_000;
        let p = RoundPlan::build(&[deep, prompt(300)], false, (&price, 256), 0);
        assert_eq!(p.target, vec![(0, TargetPart::Prefill { len: 1 })]);
    }
}
