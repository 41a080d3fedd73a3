//! Plain autoregressive decoding of one sequence: prefill the prompt, then one token per
//! forward. The reference that speculative decoding must reproduce exactly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::emitter::Emitter;
use super::EngineError;
use crate::model::{KvCache, Llama, LogitsRows, SeqInput, TextTokenizer};
use crate::sampling::{Sampler, SamplingParams, SeededRng};

#[derive(Clone, Debug, Default)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation (counted as generated; their text is not output).
    pub eos_ids: Vec<u32>,
    /// Text that ends generation; the output text stops right before it. Needs `detokenizer`.
    pub stop_strings: Vec<String>,
    /// Decodes the output to text (streamed pieces, stop strings, `GenerationOutput::text`).
    pub detokenizer: Option<Arc<TextTokenizer>>,
}

/// What the output callback sees: each generated token with the text it released (text can
/// lag behind tokens while a character or a possible stop string is incomplete), and at the
/// end, text released without a token.
#[derive(Clone, Copy, Debug)]
pub struct OutputPiece<'a> {
    pub token: Option<u32>,
    pub text: &'a str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
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
    /// The output text, stop string excluded (with a detokenizer).
    pub text: Option<String>,
    pub finish: FinishReason,
    pub stats: GenerationStats,
}

/// The output callback; returning `false` stops generation (finish reason `Cancelled`).
pub type OnOutput<'a> = dyn FnMut(OutputPiece<'_>) -> bool + 'a;

/// Decodes `req` in a fresh cache slot (freed before returning). `on_output` sees each token
/// as it is produced.
pub fn generate_plain(
    model: &Llama,
    cache: &mut KvCache,
    req: &GenerationRequest,
    on_output: &mut OnOutput<'_>,
) -> Result<GenerationOutput, EngineError> {
    in_fresh_slot(cache, req, |cache, slot| {
        decode_in_slot(model, cache, slot, req, on_output)
    })
}

/// Pushes one token through the emitter and shows it to the callback. Returns the finish
/// reason if the output ends here (the callback asking to stop included).
pub(crate) fn emit_token(
    emitter: &mut Emitter,
    tok: u32,
    on_output: &mut OnOutput<'_>,
) -> Result<Option<FinishReason>, EngineError> {
    let finish = emitter.push(tok)?;
    let go_on = on_output(OutputPiece {
        token: Some(tok),
        text: emitter.delta(),
    });
    Ok(match finish {
        Some(f) => Some(f),
        None if !go_on => {
            emitter.end(FinishReason::Cancelled)?;
            Some(FinishReason::Cancelled)
        }
        None => None,
    })
}

/// Ends the output for a reason outside the tokens and hands the callback any text that was
/// still held back.
pub(crate) fn end_output(
    emitter: &mut Emitter,
    reason: FinishReason,
    on_output: &mut OnOutput<'_>,
) -> Result<(), EngineError> {
    emitter.end(reason)?;
    if !emitter.delta().is_empty() {
        on_output(OutputPiece {
            token: None,
            text: emitter.delta(),
        });
    }
    Ok(())
}

/// Refuses a request that cannot run: invalid sampling settings or stop strings, an empty
/// prompt, or a prompt that leaves no room in a context of `context_len` tokens.
pub(crate) fn check_request(
    req: &GenerationRequest,
    context_len: usize,
) -> Result<(), EngineError> {
    req.sampling.validate()?;
    if req.stop_strings.iter().any(String::is_empty) {
        return Err(EngineError::InvalidRequest(
            "stop strings must not be empty".into(),
        ));
    }
    if !req.stop_strings.is_empty() && req.detokenizer.is_none() {
        return Err(EngineError::InvalidRequest(
            "stop strings need a detokenizer to match against".into(),
        ));
    }
    if req.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if req.prompt.len() >= context_len {
        return Err(EngineError::PromptTooLong {
            prompt: req.prompt.len(),
            context: context_len,
        });
    }
    Ok(())
}

/// Checks `req` against the cache, then runs `f` in a freshly allocated slot that is freed
/// afterwards, whatever `f` returns.
pub(crate) fn in_fresh_slot<T>(
    cache: &mut KvCache,
    req: &GenerationRequest,
    f: impl FnOnce(&mut KvCache, usize) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    check_request(req, cache.max_len())?;
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
    on_output: &mut OnOutput<'_>,
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
    let mut emitter = Emitter::new(req);
    let mut input: Vec<u32> = req.prompt.clone();
    let finish = loop {
        if emitter.generated() >= req.max_tokens {
            break FinishReason::Length; // only for max_tokens = 0: `push` reports it otherwise
        }
        let pos = cache.len(slot)?;
        if pos + input.len() > cache.max_len() {
            end_output(&mut emitter, FinishReason::ContextFull, on_output)?;
            break FinishReason::ContextFull;
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
        if emitter.generated() == 0 {
            stats.prefill = start.elapsed();
        }
        history.push(tok);
        if let Some(f) = emit_token(&mut emitter, tok, on_output)? {
            break f;
        }
        input.clear();
        input.push(tok);
    };
    stats.generated_tokens = emitter.generated();
    stats.decode = start.elapsed().saturating_sub(stats.prefill);
    let (tokens, text) = emitter.into_parts();
    Ok(GenerationOutput {
        tokens,
        text,
        finish,
        stats,
    })
}
