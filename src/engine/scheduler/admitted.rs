//! One admitted request as the scheduler keeps it, and what it contributes to a round: its γ
//! candidate, its drafter and target work items, and the emission of its tokens.

use std::time::Instant;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::drafter_tokens::DrafterTokens;
use super::foresight::NextDraft;
use crate::constraint::SequenceConstraint;
use crate::draft::{DraftTiming, Proposal};
use crate::engine::acceptance::RowGrammar;
use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::gamma::{gamma_cap, RoundGamma};
use crate::engine::governor::{Candidate, Choice, Governor};
use crate::engine::messages::{
    DraftItem, DraftOutcome, EngineEvent, PlainRun, TargetItem, TargetWork,
};
use crate::engine::request::{EngineRequest, FinishReason, SpeculationStats};
use crate::engine::speculation_settings::{RoundSpeculation, SpeculationSettings};
use crate::engine::token_source::{SourceRuns, TokenSource};
use crate::sampling::{Lenience, SampledDrafts, SeededRng, TokenLogprob};

/// A request waiting for slots: one per choice, all admitted together.
pub(super) struct Queued {
    /// The first choice's id; choice `i` is `id + i`.
    pub id: u64,
    pub request: EngineRequest,
    pub events: Vec<mpsc::UnboundedSender<EngineEvent>>,
    pub arrived: Instant,
    /// One engine capacity permit per choice, handed on to the choices when admitted.
    pub permits: OwnedSemaphorePermit,
}

/// One admitted request.
pub(super) struct Sequence {
    pub id: u64,
    pub slot: usize,
    pub reserved: usize,
    pub events: mpsc::UnboundedSender<EngineEvent>,
    pub request: EngineRequest,
    /// Prompt and output so far; while decoding, its last token is not yet in the target cache.
    pub context: Vec<u32>,
    pub prefilled: usize,
    pub emitter: Emitter,
    pub draft_rng: SeededRng,
    pub accept_rng: SeededRng,
    pub governor: Governor,
    pub spec: SpeculationStats,
    /// Pipelining group (0 or 1).
    pub group: usize,
    /// The context limit: a sequence whose context reaches it ends (`ContextFull`).
    pub max_context: usize,
    /// Drafts made in an earlier step, waiting for verification (pipelining).
    pub pending: Option<Proposal>,
    /// Context length when it last drafted (what a draft model's cache has seen, about).
    pub drafter_seen: usize,
    /// Its context in the drafter's tokens, where the drafter reads another vocabulary.
    pub drafter_tokens: DrafterTokens,
    pub arrived: Instant,
    pub admitted: Instant,
    pub last_output: Option<Instant>,
    /// Prompt logprobs gathered over the prefill chunks, sent with the first output.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// A later choice of a request: it waits for this sequence (the first choice) to prefill
    /// the prompt, then starts from a copy of its cache.
    pub waits_for: Option<u64>,
    /// The first choice of a request whose other choices wait for its prefill.
    pub leads: bool,
    /// Prompt tokens it took from the prefix cache.
    pub cached: usize,
    /// Its share of the engine's capacity, given back when the sequence is dropped.
    pub _permit: OwnedSemaphorePermit,
    /// What it speculates under this round (its request's settings over the live ones),
    /// resolved once at the round's start (`Scheduler::resolve_round_settings`).
    pub round: RoundSpeculation,
    /// Its grammar state, when the request constrains its output (`constrain.rs`).
    pub constraint: Option<SequenceConstraint>,
    /// How many of the drafts sent this round the grammar forced (they come first).
    pub round_forced: usize,
    /// The target's features the drafter has not had yet (a draft head), as `(first
    /// position, rows)` chunks.
    pub features: Vec<(usize, Vec<f32>)>,
}

/// The tokens one round released for a sequence, and whether they ended it.
pub(super) struct RoundEmission {
    pub tokens: Vec<u32>,
    pub text: String,
    /// The tokens' logprobs when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Who wrote them, when the request asked.
    pub sources: SourceRuns,
    pub finish: Option<FinishReason>,
}

impl Sequence {
    pub fn prompt_len(&self) -> usize {
        self.request.generation.prompt.len()
    }

    pub fn decoding(&self) -> bool {
        self.prefilled >= self.prompt_len()
    }

    /// The tokens its target cache holds (between rounds): the prompt prefilled so far, or
    /// everything but the newest token while decoding. A cache may hold a few more (drafts
    /// that stood past a stop), never other ones.
    pub fn cached_tokens(&self) -> &[u32] {
        if self.waits_for.is_some() {
            &[]
        } else if self.decoding() {
            &self.context[..self.context.len() - 1]
        } else {
            &self.context[..self.prefilled]
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.request.generation.max_tokens - self.emitter.generated()
    }

    /// The drafter's tokens it must take in before drafting: what it has not seen of the
    /// context beyond the two tokens every round feeds it. None where the drafter takes them
    /// in within its first draft step (a feed of at most `ROUTINE_CATCH_UP` tokens before
    /// its last), which is priced with the step.
    pub(super) fn catch_up(&self) -> usize {
        let lag = self.context.len().saturating_sub(self.drafter_seen + 2);
        let tokens = self
            .drafter_tokens
            .between(self.drafter_seen, self.drafter_seen + lag);
        if tokens + 2 > DraftTiming::ROUTINE_CATCH_UP + 1 {
            tokens
        } else {
            0
        }
    }

    /// How γ is set for the next round: the request's policy under the live settings, capped so
    /// the verification fits the context and does not draft past `max_tokens`.
    /// `next`: what the drafter will draft, where the scheduler can tell beforehand.
    pub fn candidate(&self, has_drafter: bool, context_len: usize, next: NextDraft) -> Candidate {
        let n = self.context.len() - 1;
        let remaining = self.remaining();
        let cap = gamma_cap(n, context_len, remaining);
        let kind = match next {
            NextDraft::Kind(k) => Some(k),
            NextDraft::Unknown | NextDraft::Nothing => None,
        };
        let fixed = |g: usize| Candidate {
            alpha: self.governor.alpha_of(kind),
            choice: Choice::Fixed(g),
            catch_up: 0,
            remaining,
            depth: n,
            ceiling: 1.0,
        };
        if !has_drafter || next == NextDraft::Nothing {
            return fixed(0);
        }
        match self.round.gamma.capped(cap) {
            RoundGamma::Plain => fixed(0),
            RoundGamma::Fixed(g) => fixed(g),
            RoundGamma::Adaptive { min, max } => {
                // A round of prompt lookup's match copies it: nothing is taken in first.
                let catch_up = match kind {
                    Some(k) if k > 0 => 0,
                    _ => self.catch_up(),
                };
                Candidate {
                    depth: n,
                    ..self
                        .governor
                        .candidate(min, max, (catch_up, remaining), kind)
                }
            }
        }
    }

    /// What the drafter needs to draft `gamma` tokens; the confidence gate is the request's
    /// settings over the live ones, and never stops before `gamma_min` tokens. A tree's
    /// alternatives are asked for only under exact acceptance, and only as many as fit beside
    /// the chain: the tree's nodes within `gamma_limit` (the KV headroom and the widths the costs
    /// were measured for) and the room left in the context. (They add no depth: a round still
    /// yields at most γ + 1 tokens.)
    pub fn draft_item(
        &self,
        gamma: usize,
        (context_len, gamma_limit): (usize, usize),
        live: &SpeculationSettings,
    ) -> DraftItem {
        let settings = self.round;
        let room = context_len.saturating_sub(self.context.len());
        DraftItem {
            tree_nodes: settings
                .tree_nodes
                .min(gamma_limit.min(room).saturating_sub(gamma)),
            seq: self.id,
            scope: self.request.generation.cache_scope,
            context: self.context.clone(),
            prompt_len: self.prompt_len(),
            gamma,
            params: self.request.generation.sampling.clone(),
            rng: self.draft_rng.clone(),
            gate: settings.gate,
            confidence: settings.confidence_pricing,
            gate_min: live.gamma_min.get().min(gamma),
            grammar: self.constraint.as_ref().map(SequenceConstraint::fork),
            features: self.features.clone(),
            lookup: true,
            likeliest: self.proposes_likeliest(),
        }
    }

    /// Whether this sampled request's drafter proposes its likeliest tokens this round, as
    /// its settings say or, left to the server (`auto`), as its verified positions say.
    fn proposes_likeliest(&self) -> bool {
        !self.request.generation.sampling.is_greedy()
            && match self.round.sampled_drafts {
                SampledDrafts::Sample => false,
                SampledDrafts::Likeliest => true,
                SampledDrafts::Auto => self.governor.prefers_likeliest(),
            }
    }

    /// A draft of the next round made while `drafts` are verified: from the context with every
    /// draft standing, `gamma + 1` tokens, the first a guess of the token the target adds, so
    /// that a right guess leaves `gamma` drafts (fewer near the token or context limit). `None`
    /// when the next round could not draft any.
    pub fn draft_ahead_item(
        &self,
        drafts: &[u32],
        gamma: usize,
        context_len: usize,
        live: &SpeculationSettings,
    ) -> Option<DraftItem> {
        // The next round's context: this one's, the drafts and the guess.
        let cached = self.context.len() + drafts.len();
        let remaining = self.remaining().saturating_sub(drafts.len() + 1);
        let next = gamma.min(gamma_cap(cached, context_len, remaining));
        if next == 0 {
            return None;
        }
        // The guess is drafted on top of at least gamma_min real drafts.
        let mut item = self.draft_item(next + 1, (context_len, next + 1), live);
        // A guess is checked against one chain: no tree.
        item.tree_nodes = 0;
        item.gate_min = (live.gamma_min.get() + 1).min(next + 1);
        item.context.extend_from_slice(drafts);
        // The grammar after the drafts too; drafts it forbids leave the guess unconstrained
        // (still exact: it is verified against the distribution it was drawn from).
        if let Some(g) = item.grammar.as_mut() {
            if g.advance(drafts).is_err() {
                item.grammar = None;
            }
        }
        Some(item)
    }

    pub fn target_item(
        &self,
        work: TargetWork,
        tokens: Vec<u32>,
        proposal: Proposal,
        lenience: Lenience,
    ) -> TargetItem {
        let start_pos = match work {
            TargetWork::Verify => self.context.len() - 1,
            _ => self.prefilled,
        };
        TargetItem {
            seq: self.id,
            slot: self.slot,
            start_pos,
            tokens,
            work,
            parents: proposal.input_parents(),
            proposal,
            params: self.request.generation.sampling.clone(),
            lenience,
            context: self.context.clone(),
            prompt_len: self.prompt_len(),
            rng: self.accept_rng.clone(),
            logprobs: self.request.logprobs,
            prompt_logprobs: match work {
                TargetWork::Verify => None,
                _ => self.request.prompt_logprobs,
            },
            grammar: RowGrammar::Free,
            plain_run: PlainRun::default(),
        }
    }

    /// The verification of this sequence's pending drafts (none: a plain step), under the
    /// round's resolved `lenience`.
    pub fn verify_item(&mut self, lenience: Lenience) -> TargetItem {
        let proposal = self.pending.take().unwrap_or_default();
        let mut tokens = Vec::with_capacity(1 + proposal.tokens.len());
        tokens.push(*self.context.last().expect("context holds the prompt"));
        tokens.extend_from_slice(&proposal.tokens);
        self.target_item(TargetWork::Verify, tokens, proposal, lenience)
    }

    /// The next `len` prompt tokens, to prefill.
    pub fn prefill_item(&self, len: usize, lenience: Lenience) -> TargetItem {
        let end = self.prefilled + len;
        let work = if end == self.prompt_len() {
            TargetWork::PrefillLast
        } else {
            TargetWork::PrefillChunk
        };
        let chunk = self.request.generation.prompt[self.prefilled..end].to_vec();
        self.target_item(work, chunk, Proposal::default(), lenience)
    }

    /// Pushes a round's tokens (the accepted drafts, then the sampled token) through the
    /// emitter, stopping at the first stop condition; with each token, who wrote it (kept when
    /// the request asked for token sources).
    pub fn emit_round(
        &mut self,
        round: impl Iterator<Item = (u32, TokenSource)>,
    ) -> Result<RoundEmission, EngineError> {
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut sources = SourceRuns::default();
        let keep_sources = self.request.speculative.token_sources;
        let mut finish = None;
        for (t, source) in round {
            self.context.push(t);
            tokens.push(t);
            finish = self.emitter.push(t)?;
            text.push_str(self.emitter.delta());
            if keep_sources {
                sources.push(source, self.emitter.delta());
            }
            if finish.is_some() {
                break;
            }
        }
        if finish.is_none() && self.context.len() > self.max_context {
            self.emitter.end(FinishReason::ContextFull)?;
            text.push_str(self.emitter.delta());
            if keep_sources {
                sources.push_text(self.emitter.delta());
            }
            finish = Some(FinishReason::ContextFull);
        }
        Ok(RoundEmission {
            tokens,
            text,
            logprobs: Vec::new(),
            sources,
            finish,
        })
    }

    /// Makes a draft made ahead (see [`Sequence::draft_ahead_item`]) the next drafts if its
    /// guess held: the round's drafts all stood (the caller checks) and its first token is the
    /// one the target added, `next`. Its other tokens were drafted after exactly the context
    /// the sequence now has, so they are drafts like any other, and the acceptance rule keeps
    /// the output exact. Otherwise it is dropped, and the draft RNG stays where it was.
    pub fn adopt_guess(&mut self, guess: DraftOutcome, next: u32) -> bool {
        let Ok(mut p) = guess.proposal else {
            return false;
        };
        if p.tokens.len() < 2 || p.tokens[0] != next {
            return false;
        }
        p.drop_first();
        self.pending = Some(p);
        self.draft_rng = guess.rng;
        self.drafter_seen = self.context.len();
        true
    }
}
