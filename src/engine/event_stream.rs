//! A request's stream of engine events, and the whole output gathered from it.
//!
//! Why it exists: every caller of the engine (the HTTP server, `tandem bench`, the tests) reads
//! a request's output as events; the stream owns the receiver, so dropping it cancels the
//! request, and `collect` gathers a finished output the one way they all need.

use tokio::sync::mpsc;

use super::error::EngineError;
use super::messages::{EngineEvent, GRAMMAR_TOO_COMPLEX};
use super::request::{FinishReason, Usage};
use super::token_source::{SourceRun, SourceRuns};
use crate::sampling::TokenLogprob;

/// A request's events; dropping it cancels the request.
pub struct EventStream {
    pub(super) id: u64,
    pub(super) rx: mpsc::UnboundedReceiver<EngineEvent>,
}

/// A whole finished output, gathered from a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    /// One per token when the request asked for logprobs.
    pub logprobs: Vec<TokenLogprob>,
    /// One per prompt token from the second on, when the request asked for them.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Who wrote the tokens, as runs whose texts concatenate to `text`, when the request asked
    /// for token sources.
    pub sources: Vec<SourceRun>,
    pub finish: FinishReason,
    pub usage: Usage,
}

impl EventStream {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub async fn next(&mut self) -> Option<EngineEvent> {
        self.rx.recv().await
    }

    /// The next event if one is ready (for merging several streams by hand).
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<EngineEvent>> {
        self.rx.poll_recv(cx)
    }

    /// Reads the stream to its end.
    pub async fn collect(mut self) -> Result<Completion, EngineError> {
        let (mut tokens, mut text) = (Vec::new(), String::new());
        let (mut logprobs, mut prompt_logprobs) = (Vec::new(), Vec::new());
        let mut sources = SourceRuns::default();
        while let Some(ev) = self.rx.recv().await {
            match ev {
                EngineEvent::Output {
                    tokens: t,
                    text: s,
                    logprobs: l,
                    prompt_logprobs: p,
                    sources: r,
                } => {
                    tokens.extend(t);
                    text.push_str(&s);
                    logprobs.extend(l);
                    prompt_logprobs.extend(p);
                    sources.extend(r);
                }
                EngineEvent::Done { finish, usage } => {
                    return Ok(Completion {
                        tokens,
                        text,
                        logprobs,
                        prompt_logprobs,
                        sources: sources.into_vec(),
                        finish,
                        usage,
                    })
                }
                EngineEvent::Failed(f) if f.code == Some(GRAMMAR_TOO_COMPLEX) => {
                    return Err(EngineError::GrammarTooComplex(f.message))
                }
                EngineEvent::Failed(f) if f.by_request => {
                    return Err(EngineError::InvalidRequest(f.message))
                }
                EngineEvent::Failed(f) => return Err(EngineError::Failed(f.message)),
            }
        }
        Err(EngineError::Failed("the engine stopped".into()))
    }
}
