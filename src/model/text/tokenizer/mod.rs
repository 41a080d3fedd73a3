//! Text <-> token ids for the models we serve, from either a Hugging Face folder
//! (`tokenizer.json`) or the tokenizer embedded in a GGUF file.
//!
//! The `tokenizers` crate does the BPE work; this module exists because the surrounding
//! facts a server needs are scattered and easy to get subtly wrong:
//!
//! * GGUF only names its pre-tokenizer (`tokenizer.ggml.pre`). Guessing a default for an
//!   unknown name silently produces different token ids than the model was trained on (the
//!   classic symptom: a leading "Ġ" token before the first word), so the pre-tokenizer comes
//!   from an explicit table mirroring llama.cpp, and anything else is refused.
//! * A model has several end-of-generation tokens (`<|im_end|>` *and* `<|endoftext|>`,
//!   `<|eot_id|>` *and* `<|eom_id|>`), but configs usually name only one; stopping on just
//!   that one lets the model run on past its turn.
//! * Whether to prepend BOS is a per-model property (Llama 3 wants it, SmolLM2 does not).
//! * Streaming must never emit half a UTF-8 character, which byte-level BPE tokens routinely
//!   end in ([`IncrementalDecoder`]).
//!
//! `hf` loads a Hugging Face folder, `gguf` builds the tokenizer from GGUF metadata, and
//! `incremental` turns a stream of ids into text; this file holds what both loaders produce.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

use tokenizers::Tokenizer;

use crate::model::text::chat_template::{ChatTemplate, ChatTemplateError};

mod gguf;
mod hf;
mod incremental;
mod literal;
mod token_bytes;

pub use incremental::IncrementalDecoder;
pub use literal::literal_marker;

/// Token texts that end generation when the model has them as special (control) tokens.
/// Configs typically declare only one end id; llama.cpp uses the same list to find the rest.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "</s>",
    "<end_of_turn>",
];

/// Errors of loading or running a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("invalid {path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("GGUF metadata `{0}` is missing")]
    MissingMetadata(String),
    #[error("GGUF metadata `{key}` is invalid: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error(
        "unsupported GGUF tokenizer model `{0}`: only byte-level BPE (`gpt2`) tokenizers are supported"
    )]
    UnsupportedModel(String),
    #[error(
        "unsupported GGUF pre-tokenizer `{0}`: its splitting rules are unknown here, and guessing would silently change the token ids"
    )]
    UnsupportedPreTokenizer(String),
    #[error("cannot build tokenizer: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
}

/// A loaded tokenizer together with the model facts that go with it.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Sorted, deduplicated.
    eos_ids: Vec<u32>,
    bos_id: Option<u32>,
    /// Whether the model was trained with BOS at the start of every sequence.
    add_bos: bool,
    special_ids: HashSet<u32>,
    vocab_size: usize,
    chat_template: Option<ChatTemplate>,
    /// The control tokens' texts and ids, longest first (`literal`).
    control_texts: OnceLock<Vec<(String, u32)>>,
    /// `inner` with control-token parsing off, made when a literal first spells a token.
    literal: OnceLock<Tokenizer>,
}

impl fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("eos_ids", &self.eos_ids)
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .field("chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Special tokens written in `text` (e.g. `<|im_start|>`) map to their ids. BOS is
    /// prepended only when `add_bos` is set *and* the model was trained with it, so callers
    /// can always pass `true` for the start of a prompt.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizerError> {
        // BOS is added here rather than by the tokenizer's post-processor, so that both
        // loaders behave the same and a `tokenizer.json` template cannot add it twice.
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let ids = encoding.get_ids();
        let bos = self.bos_id.filter(|_| add_bos && self.add_bos);
        let mut out = Vec::with_capacity(ids.len() + usize::from(bos.is_some()));
        out.extend(bos);
        out.extend_from_slice(ids);
        Ok(out)
    }

    /// Special tokens keep their text, so chat markup round-trips.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        // `tokenizers` silently drops ids it does not know; a bad id from a model or client
        // should be an error instead.
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    /// The token's vocabulary string (byte-level form, e.g. "Ġworld").
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Every id that ends generation, sorted and deduplicated.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether [`encode`](Self::encode) with `add_bos` prepends BOS for this model.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos_id.is_some()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Control/special tokens (chat markup, BOS, EOS), as opposed to ordinary text.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }
}
