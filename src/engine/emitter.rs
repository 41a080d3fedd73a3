//! Emits one sequence's tokens one at a time and checks its stop conditions after each.
//!
//! Why it exists: plain decoding produces one token a step and speculative decoding several a
//! round; both must stop at exactly the same token (EOS, a stop string, `max_tokens`) and never
//! let anything past it out. Keeping the checks in one place is what makes "speculative output
//! equals plain output" hold for the stop conditions too.

use std::sync::Arc;

use super::error::EngineError;
use super::request::{FinishReason, GenerationRequest};
use super::stop::StopMatcher;
use crate::model::{IncrementalDecoder, TextTokenizer};

/// The text side of an output: detokenizer plus stop strings.
struct TextOutput {
    tokenizer: Arc<TextTokenizer>,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    text: String,
}

/// One sequence's output so far.
pub struct Emitter {
    eos_ids: Vec<u32>,
    max_tokens: usize,
    tokens: Vec<u32>,
    text: Option<TextOutput>,
    finish: Option<FinishReason>,
    /// The text released by the latest `push`.
    delta: String,
}

impl Emitter {
    pub fn new(req: &GenerationRequest) -> Self {
        Self {
            eos_ids: req.eos_ids.clone(),
            max_tokens: req.max_tokens,
            tokens: Vec::with_capacity(req.max_tokens.min(4096)),
            text: req.detokenizer.as_ref().map(|t| TextOutput {
                tokenizer: Arc::clone(t),
                decoder: IncrementalDecoder::new(),
                stops: StopMatcher::new(&req.stop_strings),
                text: String::new(),
            }),
            finish: None,
            delta: String::new(),
        }
    }

    /// Adds one generated token. Returns why the output ended if it ends with this token; the
    /// token itself always counts. [`Emitter::delta`] then holds the text it released.
    pub fn push(&mut self, id: u32) -> Result<Option<FinishReason>, EngineError> {
        debug_assert!(self.finish.is_none(), "push after the output ended");
        self.tokens.push(id);
        self.delta.clear();
        let mut finish = if self.eos_ids.contains(&id) {
            Some(FinishReason::Stop)
        } else if self.tokens.len() >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        if let Some(t) = &mut self.text {
            let mut piece = String::new();
            if finish != Some(FinishReason::Stop) {
                // An EOS token's own text (e.g. `<|im_end|>`) is not part of the output.
                if let Some(p) = t.decoder.push(&t.tokenizer, id).map_err(model_err)? {
                    piece.push_str(&p);
                }
            }
            if finish.is_some() {
                if let Some(p) = t.decoder.flush(&t.tokenizer).map_err(model_err)? {
                    piece.push_str(&p);
                }
            }
            if t.stops.push(&piece, &mut self.delta) {
                finish = Some(FinishReason::Stop);
            } else if finish.is_some() {
                t.stops.release(&mut self.delta);
            }
            t.text.push_str(&self.delta);
        }
        self.finish = finish;
        Ok(finish)
    }

    /// Ends the output for a reason outside the tokens (cancelled, context full). Text held
    /// back for a possible stop string is dropped on cancellation and released otherwise.
    pub fn end(&mut self, reason: FinishReason) -> Result<(), EngineError> {
        self.delta.clear();
        if let (Some(t), false) = (&mut self.text, reason == FinishReason::Cancelled) {
            let mut piece = String::new();
            if let Some(p) = t.decoder.flush(&t.tokenizer).map_err(model_err)? {
                piece.push_str(&p);
            }
            if !t.stops.push(&piece, &mut self.delta) {
                t.stops.release(&mut self.delta);
            }
            t.text.push_str(&self.delta);
        }
        self.finish = Some(reason);
        Ok(())
    }

    /// Text released by the latest `push` or `end` (empty without a detokenizer).
    pub fn delta(&self) -> &str {
        &self.delta
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn generated(&self) -> usize {
        self.tokens.len()
    }

    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The tokens and (with a detokenizer) the text, stop string excluded.
    pub fn into_parts(self) -> (Vec<u32>, Option<String>) {
        (self.tokens, self.text.map(|t| t.text))
    }
}

fn model_err(e: crate::model::text::tokenizer::TokenizerError) -> EngineError {
    EngineError::Detokenize(e.to_string())
}
