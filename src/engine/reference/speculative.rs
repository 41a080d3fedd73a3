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
use crate::model::{Kept, KvCache, Llama, LogitsRows, SeqInput};
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
    target: &Llama,
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
    target: &Llama,
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
    let params = &req.sampling;
    let mut rng = params
        .seed
        .map(SeededRng::new)
        .unwrap_or_else(SeededRng::from_entropy);
    let prompt_len = req.prompt.len();
    let mut context = req.prompt.clone();
    let mut stats = GenerationStats {
        prompt_tokens: prompt_len,
        ..Default::default()
    };
    let mut spec_stats = SpeculationStats::default();
    let start = Instant::now();
    if req.max_tokens == 0 {
        return Ok((
            GenerationOutput {
                tokens: Vec::new(),
                text: req.detokenizer.as_ref().map(|_| String::new()),
                finish: FinishReason::Length,
                stats,
            },
            spec_stats,
        ));
    }

    // Prefill and the first token exactly as plain decoding does.
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
    let first = Sampler::default().pick(&row, params, &context, &[], &mut rng)?;
    drafter.prefill(&req.prompt)?;
    stats.prefill = start.elapsed();
    let mut emitter = Emitter::new(req);
    context.push(first);
    let mut finish = emit_token(&mut emitter, first, on_output)?;

    let mut s = Scratch::default();
    let mut verify_input: Vec<u32> = Vec::new();
    let mut proposal = Proposal::default();
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
        if gamma > 0 {
            drafter.propose(&context, prompt_len, gamma, params, &mut rng, &mut proposal)?;
            proposal.tokens.truncate(gamma);
        } else {
            proposal.clear();
        }
        let drafts = &proposal.tokens;
        verify_input.clear();
        verify_input.push(*context.last().expect("context holds the prompt"));
        verify_input.extend_from_slice(drafts);
        let logits = target.forward(
            cache,
            &[SeqInput {
                slot,
                start_pos: n,
                tokens: &verify_input,
                logits: LogitsRows::All,
                parents: &[],
            }],
        )?;
        let rows = logits.seq_rows(0)?;
        let outcome = verify(
            VerifyInput {
                params,
                context: &context,
                prompt_len,
                proposal: &proposal,
                rows,
                logprobs: None,
                grammar: &mut RowGrammar::Free,
            },
            spec.lenience,
            &mut s,
            &mut rng,
            &mut Vec::new(),
        )?;
        let keep = n + 1 + outcome.accepted;
        cache.keep(slot, Kept::First(keep))?;
        drafter.keep(keep)?;
        spec_stats.rounds += 1;
        spec_stats.draft_tokens += proposal.tokens.len();
        spec_stats.accepted_tokens += outcome.accepted;
        let accepted: Vec<u32> = proposal.tokens[..outcome.accepted].to_vec();
        for t in accepted
            .into_iter()
            .chain(std::iter::once(outcome.next_token))
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
    Ok((
        GenerationOutput {
            tokens,
            text,
            finish: finish.unwrap_or(FinishReason::Length),
            stats,
        },
        spec_stats,
    ))
}
