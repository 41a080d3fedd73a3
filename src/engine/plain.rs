//! Plain autoregressive decoding of one sequence: prefill the prompt, then one token per
//! forward. The reference that speculative decoding must reproduce exactly.

use std::time::{Duration, Instant};

use super::EngineError;
use crate::model::{KvCache, Llama, LogitsRows, SeqInput};
use crate::sampling::{Sampler, SamplingParams, SeededRng};

#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation (emitted, then generation stops).
    pub eos_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// The caller's callback asked to stop.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::Stop | Self::Cancelled => "stop",
            Self::Length | Self::ContextFull => "length",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt forward plus the first token's sampling.
    pub prefill: Duration,
    /// Every later step (forward + sampling).
    pub decode: Duration,
}

impl GenerationStats {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Tokens produced by decode steps (the first comes from the prefill) per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

#[derive(Clone, Debug)]
pub struct GenerationOutput {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: GenerationStats,
}

/// Decodes `req` in a fresh cache slot (freed before returning). `on_token` sees each token as
/// it is produced and returns `false` to stop early.
pub fn generate_plain(
    model: &Llama,
    cache: &mut KvCache,
    req: &GenerationRequest,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenerationOutput, EngineError> {
    in_fresh_slot(cache, req, |cache, slot| {
        decode_in_slot(model, cache, slot, req, on_token)
    })
}

/// Checks `req` against the cache, then runs `f` in a freshly allocated slot that is freed
/// afterwards, whatever `f` returns.
pub(crate) fn in_fresh_slot<T>(
    cache: &mut KvCache,
    req: &GenerationRequest,
    f: impl FnOnce(&mut KvCache, usize) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    req.sampling.validate()?;
    if req.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if req.prompt.len() >= cache.max_len() {
        return Err(EngineError::PromptTooLong {
            prompt: req.prompt.len(),
            context: cache.max_len(),
        });
    }
    let slot = cache.allocate().ok_or(EngineError::NoFreeSlot)?;
    let result = f(cache, slot);
    cache.free(slot)?;
    result
}

fn decode_in_slot(
    model: &Llama,
    cache: &mut KvCache,
    slot: usize,
    req: &GenerationRequest,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenerationOutput, EngineError> {
    cache.reserve(slot, req.prompt.len() + req.max_tokens)?;
    let mut rng = req
        .sampling
        .seed
        .map(SeededRng::new)
        .unwrap_or_else(SeededRng::from_entropy);
    let mut sampler = Sampler::default();
    let mut history = req.prompt.clone();
    let mut stats = GenerationStats {
        prompt_tokens: req.prompt.len(),
        ..Default::default()
    };
    let start = Instant::now();
    let mut input: Vec<u32> = req.prompt.clone();
    let mut finish = FinishReason::Length;
    while stats.generated_tokens < req.max_tokens {
        let pos = cache.len(slot)?;
        if pos + input.len() > cache.max_len() {
            finish = FinishReason::ContextFull;
            break;
        }
        let logits = model.forward(
            cache,
            &[SeqInput {
                slot,
                start_pos: pos,
                tokens: &input,
                logits: LogitsRows::Last,
            }],
        )?;
        let row = logits.seq_rows(0)?.pop().expect("asked for the last row");
        let generated = &history[req.prompt.len()..];
        let tok = sampler.pick(&row, &req.sampling, &history, generated, &mut rng)?;
        if stats.generated_tokens == 0 {
            stats.prefill = start.elapsed();
        }
        history.push(tok);
        stats.generated_tokens += 1;
        let go_on = on_token(tok);
        if req.eos_ids.contains(&tok) {
            finish = FinishReason::Stop;
            break;
        }
        if !go_on {
            finish = FinishReason::Cancelled;
            break;
        }
        input.clear();
        input.push(tok);
    }
    stats.decode = start.elapsed().saturating_sub(stats.prefill);
    Ok(GenerationOutput {
        tokens: history.split_off(req.prompt.len()),
        finish,
        stats,
    })
}
