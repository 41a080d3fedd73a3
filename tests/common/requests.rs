//! The requests tests send, each kind built in one place: a generation request (what to
//! generate and how to sample it) and an engine request (one under its own speculation
//! settings). What a test sets beyond these it states at the call.

use tandem::engine::{EngineRequest, Gamma, GammaPolicy, GenerationRequest, RequestSpeculation};
use tandem::sampling::SamplingParams;

/// Up to `max_tokens` after `prompt`, drawn under `sampling`, ended by any of `eos_ids`.
pub fn generation_request(
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
    eos_ids: &[u32],
) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens,
        sampling,
        eos_ids: eos_ids.to_vec(),
        ..Default::default()
    }
}

/// A [`generation_request`] decoded greedily: the request every parity test compares.
pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize, eos_ids: &[u32]) -> GenerationRequest {
    generation_request(prompt, max_tokens, SamplingParams::greedy(), eos_ids)
}

/// `generation` through the engine at `gamma` (the server's other speculation settings), with
/// no log-probabilities and no constraint.
pub fn engine_request(generation: GenerationRequest, gamma: GammaPolicy) -> EngineRequest {
    EngineRequest {
        generation,
        speculative: RequestSpeculation {
            gamma,
            ..Default::default()
        },
        logprobs: None,
        prompt_logprobs: None,
        constraint: None,
    }
}

/// A fixed γ of `g` drafts a round.
pub fn fixed_gamma(g: usize) -> GammaPolicy {
    GammaPolicy::Fixed(Gamma::try_from(g).unwrap())
}
