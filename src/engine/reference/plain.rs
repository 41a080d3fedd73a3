//! Plain autoregressive decoding of one sequence: prefill the prompt, then one token per
//! forward. The reference that speculative decoding must reproduce exactly.

use std::time::Instant;

use super::steps::{emit_token, end_output, in_fresh_slot};
use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::request::{
    FinishReason, GenerationOutput, GenerationRequest, GenerationStats, OnOutput,
};
use crate::model::{Decoder, KvCache, LogitsRows, SeqInput};
use crate::sampling::{Sampler, SeededRng};

/// Decodes `req` in a fresh cache slot (freed before returning). `on_output` sees each token
/// as it is produced.
pub fn generate_plain(
    model: &Decoder,
    cache: &mut KvCache,
    req: &GenerationRequest,
    on_output: &mut OnOutput<'_>,
) -> Result<GenerationOutput, EngineError> {
    in_fresh_slot(cache, req, |cache, slot| {
        decode_in_slot(model, cache, slot, req, on_output)
    })
}

fn decode_in_slot(
    model: &Decoder,
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
                parents: &[],
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
