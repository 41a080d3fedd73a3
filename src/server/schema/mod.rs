//! OpenAI request bodies, parsed strictly enough to refuse what we cannot honour.
//!
//! Why it exists: the wire format is the contract with every OpenAI client, so it lives apart
//! from the handlers. Fields we do not know are ignored (clients send many that change nothing
//! in the answer; `metadata`, `user` and the like are bounded by `free_form` first), but a field of OpenAI's or vLLM's APIs that
//! would change the answer and that tandem does not do (`functions`, `suffix`), a known field
//! of the wrong type, or a value we do not support (`best_of` above `n`) is a 400 naming it.
//!
//! `parse` reads a body and refuses what tandem does not do, `common` holds the fields both
//! endpoints share, `completion` and `chat` each endpoint's own.

mod chat;
mod common;
mod completion;
mod free_form;
mod parse;

pub use chat::{
    ChatMessageIn, ChatRequest, ContentPart, FunctionCallIn, FunctionIn, MessageContent,
    ToolCallIn, ToolIn,
};
pub use common::{CommonParams, StopInput, StreamOptions, MAX_TOP_LOGPROBS};
pub use completion::{CompletionRequest, PromptInput};
pub use free_form::check_free_form;
pub use parse::{parse_body, parse_request, EndpointFields};

#[cfg(test)]
mod tests;
