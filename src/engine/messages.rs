//! Messages between the engine's actors, and the events a request's stream carries.

use tokio::sync::mpsc;

use super::acceptance::RowGrammar;
use super::error::EngineError;
use super::governor::DraftChances;
use super::request::{EngineRequest, FinishReason, Usage};
use super::scheduler::MatchStop;
use super::token_source::SourceRun;
use crate::constraint::{ConstraintError, SequenceConstraint};
use crate::draft::{DraftTiming, Proposal};
use crate::model::cache::prefix_store::PrefixStoreStats;
use crate::sampling::{
    DraftGate, Lenience, ProposalEvidence, SamplingParams, SeededRng, TokenLogprob,
};
use crate::telemetry;

/// What a request's stream yields: output pieces, then exactly one `Done` or `Failed`.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// Tokens produced by one round and the text they released (text can lag behind tokens
    /// while a character or a possible stop string is incomplete).
    Output {
        tokens: Vec<u32>,
        text: String,
        /// One per token when the request asked for logprobs, else empty.
        logprobs: Vec<TokenLogprob>,
        /// With the first output, when the request asked for prompt logprobs: one per prompt
        /// token from the second on.
        prompt_logprobs: Vec<TokenLogprob>,
        /// Who wrote the tokens, as runs whose texts concatenate to `text`, when the request
        /// asked for token sources; else empty.
        sources: Vec<SourceRun>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Failed(Failure),
}

/// Why a request's generation failed part-way.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub message: String,
    /// The request's own settings caused it (its penalties or biases left no valid logit, its
    /// grammar grew past the per-token limits): a client error, not the server's.
    pub by_request: bool,
    /// What a client can tell such a failure by (`GRAMMAR_TOO_COMPLEX`).
    pub code: Option<&'static str>,
}

impl Failure {
    pub fn engine(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            by_request: false,
            code: None,
        }
    }

    /// How a grammar's failure ends its sequence: past llguidance's per-token limits it is
    /// the request's doing (a 400-class error naming the code, counted); anything else is the
    /// engine's.
    pub fn of_grammar(e: &EngineError) -> Self {
        match e {
            EngineError::Constraint(ConstraintError::Exhausted(why)) => {
                telemetry::record_constraint_too_complex("generation");
                Self::grammar_too_complex(format!(
                    "the grammar became too complex to follow at this point of the output \
                     ({why}); simplify it"
                ))
            }
            other => Self::engine(format!("structured output: {other}")),
        }
    }

    /// The request's grammar needed more work than llguidance's per-token limits allow.
    pub fn grammar_too_complex(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            by_request: true,
            code: Some(GRAMMAR_TOO_COMPLEX),
        }
    }
}

/// The error code of a forward whose logits were NaN or infinite through no setting of the
/// request's (a corrupt model, broken numbers): `/health` reports it until a forward is sound.
pub const NON_FINITE_LOGITS: &str = "non_finite_logits";

/// The error code of a constraint too complex: refused before it runs, or a sequence ended
/// when its grammar became too complex to follow.
pub const GRAMMAR_TOO_COMPLEX: &str = "grammar_too_complex";

/// Scheduler: a new request, already checked by `Engine::submit`, and where each of its
/// choices' events go (one choice, or several sharing the prompt's prefill). Replies with the
/// first choice's id (the others follow it). `permits` holds one engine capacity permit per
/// choice; each choice's goes back when the scheduler drops it.
pub struct Submit {
    pub request: EngineRequest,
    pub events: Vec<mpsc::UnboundedSender<EngineEvent>>,
    pub permits: tokio::sync::OwnedSemaphorePermit,
}

/// Scheduler: run one round (sent by the scheduler to itself while there is work).
pub struct Step;

/// Scheduler: counts for tests, admin and metrics.
pub struct GetSchedulerStats;

#[derive(Clone, Copy, Debug, Default, PartialEq, kameo::Reply)]
pub struct SchedulerStats {
    pub active: usize,
    pub queued: usize,
    pub rounds: u64,
    /// Time both workers were busy at once, over time at least one was.
    pub overlap_ratio: f64,
    /// Next rounds drafted during a verification within a request (pipelining with one
    /// group), and how many of them were used (every draft stood and the guess held).
    pub drafted_ahead: u64,
    pub ahead_used: u64,
    /// Prompt tokens run through the target (a request's later choices copy the first's).
    pub prefilled_tokens: u64,
    /// The prompt tokens of the queued requests (none of them prefilled yet).
    pub queued_prompt_tokens: u64,
    /// Tokens emitted to requests since start, all together.
    pub generated_tokens: u64,
    /// Rounds run as a later step of a plain run (`engine/plain_run.rs`): each spared a trip
    /// between the scheduler and the verifier's worker.
    pub plain_run_steps: u64,
}

/// CacheManager: slots and KV capacity for a request's `choices` sequences of up to `tokens`
/// each. Replies the slots (none: not admitted now).
pub struct Admit {
    pub tokens: usize,
    pub choices: usize,
}

#[derive(Debug, Default, kameo::Reply)]
pub struct Admission {
    /// One slot per choice (empty: not admitted now).
    pub slots: Vec<usize>,
}

/// CacheManager: a new sequence looked its prompt up in the prefix cache (`queried` tokens,
/// `hit` of them cached), and what the target's store holds now.
pub struct PrefixReport {
    pub queried: usize,
    pub hit: usize,
    pub store: PrefixStoreStats,
}

/// CacheManager: give a sequence's slot and capacity back.
pub struct Release {
    pub slot: usize,
    pub tokens: usize,
}

/// CacheManager: the current occupancy.
pub struct GetCacheStats;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, kameo::Reply)]
pub struct CacheStats {
    pub total_slots: usize,
    /// Slots with nothing in them.
    pub free_slots: usize,
    pub capacity_tokens: usize,
    /// Tokens reserved by running sequences.
    pub reserved_tokens: usize,
    /// What the target's prefix cache holds (its tokens, bytes and byte budget).
    pub prefix_tokens: usize,
    pub prefix_bytes: usize,
    pub prefix_budget_bytes: usize,
    /// Prompt tokens the prefix cache was asked for since start, and those it held.
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
}

impl CacheStats {
    /// No sequence holds anything: every slot is free and nothing is reserved.
    pub fn idle(&self) -> bool {
        self.free_slots == self.total_slots && self.reserved_tokens == 0
    }
}

/// What the target forward does with one sequence's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetWork {
    /// A prompt chunk that is not the last: fill the cache only.
    PrefillChunk,
    /// The prompt's last chunk: fill the cache and sample the first token.
    PrefillLast,
    /// `[g, drafts..]`: verify the drafts (none: a plain step) and sample the next token.
    Verify,
}

/// One sequence's share of a target forward.
pub struct TargetItem {
    pub seq: u64,
    pub slot: usize,
    pub start_pos: usize,
    pub tokens: Vec<u32>,
    pub work: TargetWork,
    /// The draft distributions of `tokens[1..]` (Verify).
    pub proposal: Proposal,
    /// A tree's input parents (`Proposal::input_parents`); empty for a chain.
    pub parents: Vec<u32>,
    pub params: SamplingParams,
    pub lenience: Lenience,
    /// Prompt and output so far (penalties see it); its last token is `tokens[0]` for Verify.
    pub context: Vec<u32>,
    pub prompt_len: usize,
    pub rng: SeededRng,
    /// Logprobs of the tokens this item emits (PrefillLast, Verify), with this many
    /// alternatives.
    pub logprobs: Option<usize>,
    /// Logprobs of the prompt tokens this item's rows predict (prefill).
    pub prompt_logprobs: Option<usize>,
    /// A constrained sequence's grammar, for its rows.
    pub grammar: RowGrammar,
    /// How many plain steps the item may run back to back on the verifier's worker (1: this
    /// round's alone).
    pub plain_run: PlainRun,
}

/// A plain Verify item's run of steps in one verifier job (`plain_run.rs`): each step after
/// the first feeds the token the step before sampled, and the run stops after `steps`, at a
/// token of `eos_ids`, or, with `until_match`, before a step whose context prompt lookup
/// finds a match in that the governor might draft (a round the scheduler would offer it).
/// Only a lone sequence that drafts nothing runs one (`steps` > 1).
#[derive(Clone, Debug)]
pub struct PlainRun {
    pub steps: usize,
    pub eos_ids: Vec<u32>,
    pub until_match: Option<MatchStop>,
}

impl Default for PlainRun {
    fn default() -> Self {
        Self {
            steps: 1,
            eos_ids: Vec::new(),
            until_match: None,
        }
    }
}

/// One sequence's result of a target forward.
pub struct TargetOutcome {
    pub seq: u64,
    /// Drafts that stood (Verify).
    pub accepted: usize,
    /// Their tokens, in order (for a tree, the accepted path's).
    pub accepted_tokens: Vec<u32>,
    /// What the walk did, for a tree round.
    pub tree: Option<TreeWalk>,
    /// The chain's nodes the round tried, with the drafter's confidence in each and whether it
    /// stood, when the drafter judged its nodes (kind: `Proposal::confidence_kind`).
    pub tried_chain: Vec<(f32, bool)>,
    pub confidence_kind: u8,
    /// What a sampled chain's verified rows say about proposing the drafter's likeliest
    /// tokens against drawing from it (`None`: nothing to choose).
    pub proposal_evidence: Option<ProposalEvidence>,
    /// A sampled chain's tested drafts' chances of standing (`None`: greedy, a tree, or no
    /// drafts), which the acceptance estimates learn from instead of the coin flips.
    pub draft_chances: Option<DraftChances>,
    /// The sampled token (PrefillLast, Verify).
    pub next_token: Option<u32>,
    pub rng: SeededRng,
    /// The emitted tokens' logprobs (accepted drafts, then the sampled token), when asked.
    pub logprobs: Vec<TokenLogprob>,
    /// The logprobs of the prompt tokens this item's rows predicted, when asked.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// With a draft head: the target's features of the positions that now stand (a prefill
    /// chunk's, or a verification's first row and its accepted ones), from `features_from`.
    pub features_from: usize,
    pub features: Vec<f32>,
}

/// What a tree round's walk did: its size, how its main chain fared (the acceptance estimate
/// follows the chain), and each alternative it tried with the drafter's confidence in it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TreeWalk {
    pub nodes: usize,
    pub chain_len: usize,
    /// Main-chain nodes accepted before the walk stopped or left the chain.
    pub chain_accepted: usize,
    /// The accepted path left the main chain.
    pub branched: bool,
    /// `(confidence, accepted)` of every node off the main chain the walk tried.
    pub tried_branches: Vec<(f32, bool)>,
    /// The kind of those confidences (`Proposal::confidence_kind`).
    pub kind: u8,
}

/// Verifier: one batched target forward.
pub struct TargetBatch {
    pub items: Vec<TargetItem>,
}

pub struct TargetBatchResult {
    /// Per item: its outcome, or its sequence id and what went wrong; a plain run's sequence
    /// has one per step, in order.
    pub outcomes: Vec<Result<TargetOutcome, (u64, Failure)>>,
    pub seconds: f64,
    /// Forwards run one after another: 1, or a plain run's steps.
    pub steps: usize,
    /// A mixture's forward: the distinct experts each routed layer read (empty for a dense
    /// model).
    pub expert_reads: Vec<u16>,
}

/// Verifier: give slot `to` the first `len` cached tokens of slot `from` (a choice of a
/// request starts from its first choice's prefill).
pub struct CopyPrefix {
    pub from: usize,
    pub to: usize,
    pub len: usize,
}

/// Verifier: start a new sequence's slot from the longest start of `prompt`, at most `limit`
/// tokens, that the prefix cache holds in `scope` or `running` (a running sequence's slot, of
/// the same scope, and how many tokens of the prompt it holds) does. Replies how many tokens
/// the slot holds, and what the store holds.
pub struct StartFromPrefix {
    pub slot: usize,
    pub scope: u64,
    pub prompt: Vec<u32>,
    pub limit: usize,
    pub running: Option<(usize, usize)>,
}

pub struct PrefixStart {
    pub len: usize,
    pub store: PrefixStoreStats,
}

/// Verifier: a sequence ended well: store what its slot holds for `tokens` in the prefix
/// cache's `scope`, then free the slot. Replies what the store holds.
pub struct StorePrefix {
    pub slot: usize,
    pub scope: u64,
    pub tokens: Vec<u32>,
}

/// Verifier: forget a slot's cache (the sequence ended).
pub struct FreeSlot {
    pub slot: usize,
}

/// Scheduler, Verifier and Drafter: forget everything the prefix cache holds (a benchmark's
/// next mode starts from the same cold cache as the last).
pub struct ClearPrefixCache;

/// Drafter: draft for several sequences.
pub struct DraftBatch {
    pub items: Vec<DraftItem>,
}

pub struct DraftItem {
    pub seq: u64,
    /// The prefix cache's scope of its request (a draft model starts its cache from texts of
    /// this scope alone).
    pub scope: u64,
    /// Prompt and output so far; its last token is not yet verified.
    pub context: Vec<u32>,
    pub prompt_len: usize,
    pub gamma: usize,
    pub params: SamplingParams,
    pub rng: SeededRng,
    /// When a draft model stops this round early, after at least `gate_min` tokens.
    pub gate: DraftGate,
    pub gate_min: usize,
    /// Report the drafter's confidence in each drafted token (for confidence pricing).
    pub confidence: bool,
    /// Up to this many alternative nodes beside the chain (a token tree; 0: a chain).
    pub tree_nodes: usize,
    /// A constrained sequence's grammar state after `context`, forked: a draft model drafts
    /// from its distribution masked by it.
    pub grammar: Option<SequenceConstraint>,
    /// The target's features (hidden states) the drafter has not had yet, as `(first
    /// position, rows)` chunks: a draft head drafts from them. Empty for other drafters.
    pub features: Vec<(usize, Vec<f32>)>,
    /// A drafter that drafts prompt lookup's match first may do so (see `DraftJob::lookup`).
    pub lookup: bool,
    /// Propose the drafter's likeliest tokens as point masses (see `DraftJob::likeliest`).
    pub likeliest: bool,
}

pub struct DraftOutcome {
    pub seq: u64,
    pub proposal: Result<Proposal, String>,
    pub rng: SeededRng,
}

/// The drafts of a batch, and what they cost.
#[derive(Default)]
pub struct DraftBatchResult {
    pub outcomes: Vec<DraftOutcome>,
    pub timing: DraftTiming,
}

/// Drafter: the sequence ended; drop its state (a draft model's cache is kept for its prefix
/// when `keep` and the prefix cache are on).
pub struct EndSequence {
    pub seq: u64,
    pub keep: bool,
    /// Its prompt and output (a drafter across requests remembers them).
    pub text: Vec<u32>,
}

/// Drafter: what drafting costs, measured at start-up: a draft step after, and taking in, a
/// context of each length (catch-ups cost more per token the deeper they go). Replies one
/// timing per length.
pub struct MeasureDraftCosts {
    pub contexts: Vec<usize>,
}
