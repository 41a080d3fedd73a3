//! What a round's target forward leaves for each sequence: prefill progress, or accepted
//! drafts and a new token, emitted to the request's stream; and a finished sequence's last
//! event.

use std::collections::HashMap;
use std::time::Instant;

use super::admitted::{RoundEmission, Sequence};
use super::state::{record_finished, Ending, Learned, Scheduler, POOLED_ACCEPTANCE_DECAY};
use crate::engine::messages::{
    DraftOutcome, EngineEvent, Failure, TargetOutcome, NON_FINITE_LOGITS,
};
use crate::engine::request::{FinishReason, Usage};
use crate::engine::token_source::RoundShape;
use crate::telemetry;

impl Scheduler {
    /// Applies one sequence's result of the target forward: prefill progress, or the round's
    /// acceptance (counters, governor, cost estimates) and its tokens. Returns how the
    /// sequence ended, if it did.
    pub(super) fn take_outcome(
        &mut self,
        outcome: Result<TargetOutcome, (u64, Failure)>,
        sent: &HashMap<u64, (usize, Vec<u32>)>,
        guessed: &mut HashMap<u64, DraftOutcome>,
    ) -> Option<Ending> {
        let o = match outcome {
            Ok(o) => {
                self.liveness.forward_was_finite(true);
                o
            }
            Err((seq, msg)) => {
                if msg.code == Some(NON_FINITE_LOGITS) {
                    self.liveness.forward_was_finite(false);
                    telemetry::record_non_finite_forward();
                }
                return self
                    .active
                    .iter()
                    .any(|s| s.id == seq)
                    .then_some((seq, Err(msg)));
            }
        };
        let id = o.seq;
        self.learn_from_round(&o);
        let s = self.active.iter_mut().find(|s| s.id == id)?;
        let (chunk_len, drafts) = &sent[&id];
        if !s.decoding() {
            s.prefilled += chunk_len;
            s.prompt_logprobs.extend(o.prompt_logprobs);
            if s.decoding() {
                telemetry::record_prefill(s.admitted.elapsed().as_secs_f64());
            }
        } else {
            count_decoding_round(&mut self.learned, s, &o, drafts.len());
        }
        s.accept_rng = o.rng;
        if !o.features.is_empty() {
            s.features.push((o.features_from, o.features));
        }
        let next = o.next_token?;
        let shape = RoundShape {
            drafted: drafts.len(),
            accepted: o.accepted,
            forced: s.round_forced,
            all_stood: match &o.tree {
                Some(t) => !t.branched && t.chain_accepted == t.chain_len,
                None => o.accepted == drafts.len(),
            },
            origin: self.cfg.origins.of_kind(o.confidence_kind),
        };
        let round = o.accepted_tokens.iter().copied().chain([next]);
        match s.emit_round(round.zip(shape.sources())) {
            Ok(mut emission) => {
                // The grammar follows what was emitted (nothing past a stop matters).
                if let Some(c) = s.constraint.as_mut() {
                    if let Err(e) = c.advance(&emission.tokens) {
                        return Some((id, Err(Failure::of_grammar(&e.into()))));
                    }
                }
                let mut logprobs = o.logprobs;
                logprobs.truncate(emission.tokens.len());
                emission.logprobs = logprobs;
                let finish = emission.finish;
                self.counters.generated_tokens += emission.tokens.len() as u64;
                send_output(s, emission);
                if let Some(finish) = finish {
                    return Some((id, Ok(finish)));
                }
                if let Some(g) = guessed.remove(&id) {
                    let used = o.accepted == drafts.len() && s.adopt_guess(g, next);
                    self.counters.drafted_ahead += 1;
                    self.counters.ahead_used += u64::from(used);
                    telemetry::record_draft_ahead(used);
                }
                None
            }
            Err(e) => Some((id, Err(Failure::engine(e.to_string())))),
        }
    }

    /// Sends a sequence's last event and gives its resources back.
    pub(super) async fn end_sequence(&mut self, (id, end): Ending) {
        let Some(pos) = self.active.iter().position(|s| s.id == id) else {
            return;
        };
        let mut s = self.active.swap_remove(pos);
        if let (Ok(FinishReason::Length | FinishReason::ContextFull), Some(c)) =
            (&end, s.constraint.as_mut())
        {
            if !c.is_accepting() {
                tracing::info!(
                    seq = id,
                    generated = s.emitter.generated(),
                    "a constrained output reached its token limit before its grammar was complete"
                );
            }
        }
        record_finished(
            match &end {
                Ok(finish) => finish.as_openai(),
                Err(_) => "error",
            },
            &s,
        );
        tracing::debug!(
            seq = id,
            drafting_net_ms = s.governor.drafting_net() * 1e3,
            may_draft = s.governor.may_draft(),
            "what drafting saved the request, net"
        );
        // A failed sequence's cache is not trusted for later prompts.
        let keep = end.is_ok();
        let event = match end {
            Ok(finish) => EngineEvent::Done {
                finish,
                usage: Usage {
                    prompt_tokens: s.prompt_len(),
                    cached_tokens: s.cached,
                    completion_tokens: s.emitter.generated(),
                    speculative: s.spec.clone(),
                },
            },
            Err(msg) => EngineEvent::Failed(msg),
        };
        // Resources first: once a client sees its request end, its slot is free again.
        let events = s.events.clone();
        self.retire(s, keep).await;
        let _ = events.send(event);
    }
}

/// A decoding round's outcome counted: the request's stats and governor, the pooled acceptance
/// and speedup estimate the governor learns from, and the round's metrics.
fn count_decoding_round(
    learned: &mut Learned,
    s: &mut Sequence,
    o: &TargetOutcome,
    drafted: usize,
) {
    telemetry::record_round(drafted, o.accepted);
    tracing::debug!(seq = o.seq, drafted, accepted = o.accepted, "outcome");
    learned.speedup.record(drafted, o.accepted, &learned.costs);
    if drafted > 0 {
        s.spec.rounds += 1;
        s.spec.draft_tokens += drafted;
        s.spec.accepted_tokens += o.accepted;
        s.spec.forced_tokens += s.round_forced;
        s.spec.forced_accepted += o.accepted.min(s.round_forced);
        telemetry::record_forced(s.round_forced, o.accepted.min(s.round_forced));
    }
    // The acceptance estimate follows the chain: a tree's alternatives have their own.
    let (chain, chain_accepted) = match &o.tree {
        Some(t) => (t.chain_len, t.chain_accepted),
        None => (drafted, o.accepted),
    };
    let kind = o.confidence_kind;
    let class = learned.acceptance.class_mut(&s.request.generation.sampling);
    match o.draft_chances.filter(|_| o.tree.is_none()) {
        Some(c) => {
            s.governor.record_round_chances(kind, chain, c);
            class
                .rates
                .record_chances(kind, chain, c, POOLED_ACCEPTANCE_DECAY);
        }
        None => {
            s.governor.record_round_of(kind, chain, chain_accepted);
            class
                .rates
                .record(kind, chain, chain_accepted, POOLED_ACCEPTANCE_DECAY);
        }
    }
    if let Some(share) = s.governor.prompt_coverage().filter(|_| kind == 0) {
        class.coverage.record(share, chain, POOLED_ACCEPTANCE_DECAY);
    }
    if let Some(e) = &o.proposal_evidence {
        s.governor.record_proposals(e);
        let (drawn, likeliest) = s.governor.proposal_rates();
        tracing::debug!(
            seq = o.seq,
            positions = e.rows,
            drawn,
            likeliest,
            "sampled proposals: how often each would stand"
        );
        class.proposals.record(e, POOLED_ACCEPTANCE_DECAY);
        telemetry::record_proposal_evidence(e);
    }
    if let Some(t) = &o.tree {
        s.spec.tree_rounds += 1;
        s.spec.tree_nodes += t.nodes;
        s.spec.tree_branch_accepts += usize::from(t.branched);
        telemetry::record_tree_round(t.nodes, t.branched);
    }
}

/// Sends a round's output as one event, and records when its tokens came.
fn send_output(s: &mut Sequence, e: RoundEmission) {
    let now = Instant::now();
    telemetry::record_tokens(
        e.tokens.len(),
        s.last_output.map(|t| (now - t).as_secs_f64()),
        (now - s.arrived).as_secs_f64(),
    );
    s.last_output = Some(now);
    let _ = s.events.send(EngineEvent::Output {
        tokens: e.tokens,
        text: e.text,
        logprobs: e.logprobs,
        sources: e.sources.into_vec(),
        // The other choices of its request start with a copy of them.
        prompt_logprobs: if s.leads {
            s.prompt_logprobs.clone()
        } else {
            std::mem::take(&mut s.prompt_logprobs)
        },
    });
}
