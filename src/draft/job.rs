//! What a batched draft is asked for and what it cost: one [`DraftJob`] per sequence, shared by
//! every drafter that drafts for many sequences at once, and its [`DraftTiming`].

use super::{DraftError, Proposal};
use crate::constraint::SequenceConstraint;
use crate::sampling::{DraftGate, SamplingParams, SeededRng};

/// One sequence's share of a batched draft: its context (last token not yet verified), where
/// its output starts (for penalties), how many tokens to draft, and where they go.
pub struct DraftJob<'a> {
    pub seq: u64,
    /// The prefix cache's scope of its request: a draft model starts a new sequence's cache
    /// from its scope's texts alone.
    pub scope: u64,
    pub context: &'a [u32],
    pub generated_from: usize,
    pub gamma: usize,
    pub params: &'a SamplingParams,
    pub rng: &'a mut SeededRng,
    pub out: &'a mut Proposal,
    /// When to stop drafting early ([`DraftGate`]; `DraftGate::OFF` never does), after at
    /// least `min_tokens` tokens.
    pub gate: DraftGate,
    pub min_tokens: usize,
    /// Report the confidence in each drafted token (the governor prices chains by it).
    pub confidence: bool,
    /// Up to this many alternatives beside the chain, making the proposal a token tree: the
    /// drafter's runners-up where it was least sure (see [`Siblings`]).
    pub tree_nodes: usize,
    /// A constrained request's grammar state (a fork of it): each draft is taken from the
    /// draft model's distribution masked by the grammar, which is then the `q` the drafts are
    /// verified against, and the state follows the drafts.
    pub grammar: Option<&'a mut SequenceConstraint>,
    /// A drafter that drafts prompt lookup's match first may do so this round; `false`: the
    /// scheduler judged its model likelier to be right here than this match.
    pub lookup: bool,
    /// A sampled request's drafts are the drafter's likeliest tokens, proposed as point masses
    /// (`SampledDrafts::Likeliest`), not draws from its distribution. Greedy ones always are.
    pub likeliest: bool,
    pub result: Result<(), DraftError>,
}

/// What a batched draft cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftTiming {
    /// Forwards of the draft steps (one per step, all sequences together).
    pub steps: usize,
    /// All the steps together.
    pub step_seconds: f64,
    /// The first step alone (0 = not timed apart: steps cost alike). After a round whose
    /// drafts all stood it also takes in the last draft and the target's bonus token, so it
    /// costs ~1.3x a later step, and pricing every step at the average made long drafts look
    /// dearer than they are to a request drafting 1 token a round.
    pub first_step_seconds: f64,
    /// Tokens fed into the first step, every drafting sequence's together: its width.
    pub first_step_tokens: usize,
    /// Context tokens the cache had to take in before drafting (a prompt, or output decoded
    /// while speculation was off) beyond what the first step took in
    /// ([`Self::ROUTINE_CATCH_UP`]).
    pub catch_up_tokens: usize,
    pub catch_up_seconds: f64,
}

impl DraftTiming {
    /// Most tokens a lane's feed may hold beyond its last and still go whole into the first
    /// draft step: a drafter of another vocabulary reads a target token it does not share as
    /// several of its own, so a few more than the round's last draft and bonus token come
    /// with most rounds. Taken in by a forward of their own, they cost a whole drafter forward
    /// a round (2.1 ms of SmolLM2's 4.5 ms of drafting for Gemma 3, γ = 1); in the first
    /// step, a slightly wider one. A longer feed is a lag (a prompt, plainly decoded text),
    /// caught up apart and priced as a catch-up.
    pub const ROUTINE_CATCH_UP: usize = 8;
}
