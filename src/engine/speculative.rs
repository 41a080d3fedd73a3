//! Speculative decoding of one sequence (DESIGN.md §3): each round the drafter proposes γ
//! tokens after the last sampled token `g`, the target verifies `[g, t1..tγ]` in one forward,
//! the acceptance rule keeps a prefix and adds a correction or bonus token, and the target cache
//! is rolled back to what stands. With lenience 1 the output is distributed exactly as plain
//! sampling (greedy: identical token for token to `generate_plain`, thanks to the model's batch
//! invariance).

use std::time::Instant;

use super::emitter::Emitter;
use super::plain::{
    emit_token, end_output, in_fresh_slot, FinishReason, GenerationOutput, GenerationRequest,
    GenerationStats, OnOutput,
};
use super::EngineError;
use crate::draft::{DraftError, Drafter, Proposal};
use crate::model::{KvCache, Llama, LogitsRows, SeqInput};
use crate::sampling::speculative::{accept_greedy, accept_sampled, DraftDist, SpecError};
use crate::sampling::{apply_penalties, probabilities, Sampler, SamplingParams, SeededRng};

/// Speculation settings of one request.
#[derive(Clone, Copy, Debug)]
pub struct SpecSettings {
    /// Drafted tokens per round (γ); rounds near the context or token limit draft fewer.
    pub gamma: usize,
    /// 1 is exact; lower accepts more drafts at the cost of exactness.
    pub lenience: f32,
}

/// Speculation counters of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    pub rounds: usize,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
}

impl SpecStats {
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted_tokens as f64 / self.draft_tokens.max(1) as f64
    }

    /// Tokens emitted per round (accepted drafts plus the correction or bonus).
    pub fn mean_accepted_length(&self) -> f64 {
        1.0 + self.accepted_tokens as f64 / self.rounds.max(1) as f64
    }
}

impl From<DraftError> for EngineError {
    fn from(e: DraftError) -> Self {
        EngineError::Draft(e.to_string())
    }
}

impl From<SpecError> for EngineError {
    fn from(e: SpecError) -> Self {
        EngineError::Speculation(e.to_string())
    }
}

/// Decodes `req` speculatively in a fresh target cache slot (freed before returning).
pub fn generate_speculative(
    target: &Llama,
    cache: &mut KvCache,
    drafter: &mut dyn Drafter,
    req: &GenerationRequest,
    spec: SpecSettings,
    on_output: &mut OnOutput<'_>,
) -> Result<(GenerationOutput, SpecStats), EngineError> {
    if !(spec.lenience > 0.0 && spec.lenience <= 1.0) {
        return Err(SpecError::InvalidLenience(spec.lenience).into());
    }
    in_fresh_slot(cache, req, |cache, slot| {
        run(target, cache, slot, drafter, req, spec, on_output)
    })
}

/// Per-round scratch, reused so rounds do not allocate.
#[derive(Default)]
pub(crate) struct Scratch {
    verify: Vec<u32>,
    logits: Vec<f32>,
    target_probs: Vec<Vec<f32>>,
    residual: Vec<f32>,
}

fn run(
    target: &Llama,
    cache: &mut KvCache,
    slot: usize,
    drafter: &mut dyn Drafter,
    req: &GenerationRequest,
    spec: SpecSettings,
    on_output: &mut OnOutput<'_>,
) -> Result<(GenerationOutput, SpecStats), EngineError> {
    cache.reserve(slot, req.prompt.len() + req.max_tokens + spec.gamma + 1)?;
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
    let mut spec_stats = SpecStats::default();
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
    let mut proposal = Proposal::default();
    while finish.is_none() {
        let n = cache.len(slot)?; // the context minus its last token `g`
        if n + 1 > cache.max_len() {
            end_output(&mut emitter, FinishReason::ContextFull, on_output)?;
            finish = Some(FinishReason::ContextFull);
            break;
        }
        let remaining = req.max_tokens - emitter.generated();
        let gamma = spec.gamma.min(cache.max_len() - n - 1).min(remaining - 1);
        if gamma > 0 {
            drafter.propose(&context, prompt_len, gamma, params, &mut rng, &mut proposal)?;
            proposal.tokens.truncate(gamma);
        } else {
            proposal.clear();
        }
        let drafts = &proposal.tokens;
        s.verify.clear();
        s.verify
            .push(*context.last().expect("context holds the prompt"));
        s.verify.extend_from_slice(drafts);
        let logits = target.forward(
            cache,
            &[SeqInput {
                slot,
                start_pos: n,
                tokens: &s.verify,
                logits: LogitsRows::All,
            }],
        )?;
        let rows = logits.seq_rows(0)?;
        let outcome = verify(
            params,
            spec.lenience,
            &context,
            prompt_len,
            drafts,
            &proposal,
            rows,
            &mut s,
            &mut rng,
        )?;
        let keep = n + 1 + outcome.accepted;
        cache.truncate_to(slot, keep)?;
        drafter.rollback(keep)?;
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

/// Applies the request's processors to each verified row (row i sees the context plus the
/// first i drafts, exactly the history plain decoding would have had) and runs the acceptance
/// rule.
#[allow(clippy::too_many_arguments)]
pub(crate) fn verify(
    params: &SamplingParams,
    lenience: f32,
    context: &[u32],
    prompt_len: usize,
    drafts: &[u32],
    proposal: &Proposal,
    rows: Vec<Vec<f32>>,
    s: &mut Scratch,
    rng: &mut SeededRng,
) -> Result<crate::sampling::speculative::RoundOutcome, EngineError> {
    let mut history = context.to_vec();
    s.target_probs.resize_with(rows.len(), Vec::new);
    for (i, row) in rows.into_iter().enumerate() {
        if i > 0 {
            history.push(drafts[i - 1]);
        }
        s.logits.clear();
        s.logits.extend_from_slice(&row);
        apply_penalties(&mut s.logits, params, &history, &history[prompt_len..]);
        if params.is_greedy() {
            if lenience < 1.0 {
                // Lenient greedy compares probabilities: softmax of the processed logits.
                probabilities(
                    &s.logits,
                    &SamplingParams {
                        temperature: 1.0,
                        ..SamplingParams::default()
                    },
                    &mut s.target_probs[i],
                )?;
            } else {
                s.target_probs[i].clear();
                s.target_probs[i].extend_from_slice(&s.logits);
            }
        } else {
            probabilities(&s.logits, params, &mut s.target_probs[i])?;
        }
    }
    let p: Vec<&[f32]> = s.target_probs[..drafts.len() + 1]
        .iter()
        .map(Vec::as_slice)
        .collect();
    Ok(if params.is_greedy() {
        accept_greedy(drafts, &p, lenience)?
    } else {
        let q: Vec<DraftDist> = (0..drafts.len())
            .map(|i| {
                proposal
                    .dist(i)
                    .map_or(DraftDist::PointMass, DraftDist::Full)
            })
            .collect();
        accept_sampled(drafts, &q, &p, lenience, rng, &mut s.residual)?
    })
}
