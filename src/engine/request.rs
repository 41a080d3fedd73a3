//! What a generation request is and what it yields, and the checks every request passes before
//! any work is done for it: shared by the reference loops and the actor engine.

use std::sync::Arc;
use std::time::Duration;

use super::error::EngineError;
use super::speculation_settings::RequestSpeculation;
use crate::constraint::CompiledConstraint;
use crate::model::TextTokenizer;
use crate::sampling::SamplingParams;

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
    /// The prefix cache's scope it starts from and stores into: its tenant (0: the scope of
    /// requests with no tenant of their own). A prompt is never started from another scope's
    /// text.
    pub cache_scope: u64,
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

/// Speculation counters of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpeculationStats {
    pub rounds: usize,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
    /// Rounds verified as a token tree, their nodes (in `draft_tokens` too), and how many of
    /// them accepted a path that left the drafted chain.
    pub tree_rounds: usize,
    pub tree_nodes: usize,
    pub tree_branch_accepts: usize,
    /// Drafts the grammar forced (in `draft_tokens` too) and how many of them stood.
    pub forced_tokens: usize,
    pub forced_accepted: usize,
}

impl SpeculationStats {
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted_tokens as f64 / self.draft_tokens.max(1) as f64
    }

    /// Tokens emitted per round (accepted drafts plus the correction or bonus).
    pub fn mean_accepted_length(&self) -> f64 {
        1.0 + self.accepted_tokens as f64 / self.rounds.max(1) as f64
    }
}

/// A request to the engine.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    pub generation: GenerationRequest,
    /// The request's own speculation settings over the server's live ones (`None` fields
    /// follow the server, round by round).
    pub speculative: RequestSpeculation,
    /// Report each generated token's log-probability with this many alternatives
    /// ([`crate::sampling::token_logprob`]: after logit bias and penalties).
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability (from the second on) with this many
    /// alternatives: the model's own distribution, no processors (nothing was sampled there).
    pub prompt_logprobs: Option<usize>,
    /// The grammar its output must match (structured outputs), compiled before it was
    /// queued; each of its sequences runs its own matcher.
    pub constraint: Option<CompiledConstraint>,
}

/// Token counts of a finished request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache rather than prefilled.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub speculative: SpeculationStats,
}

/// Refuses a request that cannot run: invalid sampling settings or stop strings, an empty
/// prompt, or a prompt that leaves no room in a context of `context_len` tokens.
pub fn check_request(req: &GenerationRequest, context_len: usize) -> Result<(), EngineError> {
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
