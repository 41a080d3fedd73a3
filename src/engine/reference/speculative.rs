//! Speculative decoding of one sequence (docs/speculation.md, "One round"): each round the drafter proposes γ
//! tokens after the last sampled token `g`, the target verifies `[g, t1..tγ]` in one forward,
//! the acceptance rule keeps a prefix and adds a correction or bonus token, and the target cache
//! is rolled back to what stands. With lenience 1 the output is distributed exactly as plain
//! sampling (greedy: identical token for token to `generate_plain`, thanks to the model's batch
//! invariance).

use std::time::Instant;

use super::steps::{emit_token, end_output, in_fresh_slot};
use crate::draft::{Proposal, Proposer};
use crate::engine::acceptance::{verify, RowGrammar, Scratch, VerifyInput};
use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::gamma::{gamma_cap, Gamma};
use crate::engine::request::{
    FinishReason, GenerationOutput, GenerationRequest, GenerationStats, OnOutput, SpeculationStats,
};
use crate::model::{Decoder, Kept, KvCache, LogitsRows, SeqInput};
use crate::sampling::{Lenience, Sampler, SeededRng};

/// The speculation of one reference run: a fixed γ and lenience for every round.
#[derive(Clone, Copy, Debug)]
pub struct FixedSpeculation {
    /// Drafted tokens per round; rounds near the context or token limit draft fewer.
    pub gamma: Gamma,
    /// 1 is exact; lower accepts more drafts at the cost of exactness.
    pub lenience: Lenience,
}

/// Decodes `req` speculatively in a fresh target cache slot (freed before returning).
pub fn generate_speculative(
    target: &Decoder,
    cache: &mut KvCache,
    drafter: &mut dyn Proposer,
    req: &GenerationRequest,
    spec: FixedSpeculation,
    on_output: &mut OnOutput<'_>,
) -> Result<(GenerationOutput, SpeculationStats), EngineError> {
    in_fresh_slot(cache, req, |cache, slot| {
        run(target, cache, slot, drafter, req, spec, on_output)
    })
}

fn run(
    target: &Decoder,
    cache: &mut KvCache,
    slot: usize,
    drafter: &mut dyn Proposer,
    req: &GenerationRequest,
    spec: FixedSpeculation,
    on_output: &mut OnOutput<'_>,
) -> Result<(GenerationOutput, SpeculationStats), EngineError> {
    cache.reserve(
        slot,
        req.prompt.len() + req.max_tokens + spec.gamma.get() + 1,
    )?;
    let mut rng = req
        .sampling
        .seed
        .map(SeededRng::new)
        .unwrap_or_else(SeededRng::from_entropy);
    let mut stats = GenerationStats {
        prompt_tokens: req.prompt.len(),
        ..Default::default()
    };
    let mut spec_stats = SpeculationStats::default();
    let start = Instant::now();
    if req.max_tokens == 0 {
        let output = GenerationOutput {
            tokens: Vec::new(),
            text: req.detokenizer.as_ref().map(|_| String::new()),
            finish: FinishReason::Length,
            stats,
        };
        return Ok((output, spec_stats));
    }
    let first = first_token(target, cache, slot, req, &mut rng)?;
    drafter.prefill(&req.prompt)?;
    stats.prefill = start.elapsed();
    let mut emitter = Emitter::new(req);
    let mut context = req.prompt.clone();
    context.push(first);
    let mut finish = emit_token(&mut emitter, first, on_output)?;
    let mut buffers = RoundBuffers::default();
    while finish.is_none() {
        let n = cache.len(slot)?; // the context minus its last token `g`
        if n + 1 > cache.max_len() {
            end_output(&mut emitter, FinishReason::ContextFull, on_output)?;
            finish = Some(FinishReason::ContextFull);
            break;
        }
        let remaining = req.max_tokens - emitter.generated();
        let gamma = spec
            .gamma
            .get()
            .min(gamma_cap(n, cache.max_len(), remaining));
        let mut round = Round {
            target,
            cache: &mut *cache,
            slot,
            drafter: &mut *drafter,
            req,
            rng: &mut rng,
        };
        let (accepted, next) = round.run(&context, gamma, spec.lenience, &mut buffers)?;
        spec_stats.rounds += 1;
        spec_stats.draft_tokens += buffers.proposal.tokens.len();
        spec_stats.accepted_tokens += accepted;
        for &t in buffers.proposal.tokens[..accepted]
            .iter()
            .chain(std::iter::once(&next))
        {
            context.push(t);
            finish = emit_token(&mut emitter, t, on_output)?;
            if finish.is_some() {
                break;
            }
        }
    }
    stats.generated_tokens = emitter.generated();
    stats.decode = start.elapsed().saturating_sub(stats.prefill);
    let (tokens, text) = emitter.into_parts();
    let output = GenerationOutput {
        tokens,
        text,
        finish: finish.unwrap_or(FinishReason::Length),
        stats,
    };
    Ok((output, spec_stats))
}

/// Prefill and the first token, exactly as plain decoding does.
fn first_token(
    target: &Decoder,
    cache: &mut KvCache,
    slot: usize,
    req: &GenerationRequest,
    rng: &mut SeededRng,
) -> Result<u32, EngineError> {
    let logits = target.forward(
        cache,
        &[SeqInput {
            slot,
            start_pos: 0,
            tokens: &req.prompt,
            logits: LogitsRows::Last,
            parents: &[],
        }],
    )?;
    let row = logits.seq_rows(0)?.pop().expect("asked for the last row");
    Ok(Sampler::default().pick(&row, &req.sampling, &req.prompt, &[], rng)?)
}

/// Buffers reused from round to round; `proposal` holds the last round's drafts.
#[derive(Default)]
struct RoundBuffers {
    scratch: Scratch,
    verify_input: Vec<u32>,
    proposal: Proposal,
}

/// What one round works on.
struct Round<'a> {
    target: &'a Decoder,
    cache: &'a mut KvCache,
    slot: usize,
    drafter: &'a mut dyn Proposer,
    req: &'a GenerationRequest,
    rng: &'a mut SeededRng,
}

impl Round<'_> {
    /// Up to `gamma` drafts after `context`, one verification forward, the acceptance rule,
    /// and both caches keep what stands. Returns how many drafts stood and the token after
    /// them.
    fn run(
        &mut self,
        context: &[u32],
        gamma: usize,
        lenience: Lenience,
        b: &mut RoundBuffers,
    ) -> Result<(usize, u32), EngineError> {
        let (cache, slot, params) = (&mut *self.cache, self.slot, &self.req.sampling);
        let n = cache.len(slot)?; // the context minus its last token `g`
        let prompt_len = self.req.prompt.len();
        if gamma > 0 {
            self.drafter.propose(
                context,
                prompt_len,
                gamma,
                params,
                self.rng,
                &mut b.proposal,
            )?;
            b.proposal.tokens.truncate(gamma);
        } else {
            b.proposal.clear();
        }
        b.verify_input.clear();
        b.verify_input
            .push(*context.last().expect("context holds the prompt"));
        b.verify_input.extend_from_slice(&b.proposal.tokens);
        let logits = self.target.forward(
            cache,
            &[SeqInput {
                slot,
                start_pos: n,
                tokens: &b.verify_input,
                logits: LogitsRows::All,
                parents: &[],
            }],
        )?;
        let rows = logits.seq_rows(0)?;
        let outcome = verify(
            VerifyInput {
                params,
                context,
                prompt_len,
                proposal: &b.proposal,
                rows,
                logprobs: None,
                grammar: &mut RowGrammar::Free,
            },
            lenience,
            &mut b.scratch,
            self.rng,
            &mut Vec::new(),
        )?;
        let keep = n + 1 + outcome.accepted;
        cache.keep(slot, Kept::First(keep))?;
        self.drafter.keep(keep)?;
        Ok((outcome.accepted, outcome.next_token))
    }
}
