//! The loaded tokenizer: encoding and decoding, and the model facts that go with them (end and
//! start tokens, special ids, the chat template).
//!
//! Why it exists: both loaders (`hf`, `gguf`) produce this one type, so everything above the
//! model sees the same tokenizer whichever file it came from.

use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

use tokenizers::Tokenizer;

use super::TokenizerError;
use crate::model::text::chat_template::ChatTemplate;

/// How a vocabulary's pieces spell bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PieceKind {
    /// GPT-2's printable stand-in characters, one a byte ("Ġ" a space).
    ByteLevel,
    /// SentencePiece: text with `▁` for a space, and `<0xXX>` byte tokens.
    SentencePiece,
}

/// A loaded tokenizer together with the model facts that go with it.
#[derive(Clone)]
pub struct TextTokenizer {
    pub(super) inner: Tokenizer,
    /// Sorted, deduplicated.
    pub(super) eos_ids: Vec<u32>,
    pub(super) bos_id: Option<u32>,
    /// Whether the model was trained with BOS at the start of every sequence.
    pub(super) add_bos: bool,
    pub(super) special_ids: HashSet<u32>,
    pub(super) vocab_size: usize,
    pub(super) chat_template: Option<ChatTemplate>,
    /// How the vocabulary spells bytes.
    pub(super) pieces: PieceKind,
    /// The control tokens' texts and ids, longest first (`literal`).
    pub(super) control_texts: OnceLock<Vec<(String, u32)>>,
    /// `inner` with control-token parsing off, made when a literal first spells a token.
    pub(super) literal: OnceLock<Tokenizer>,
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
    /// Uses the Jinja template `source` as the chat template (a base model's file has none;
    /// `model.chat_template`), with the model's BOS and first end token as its
    /// `bos_token`/`eos_token`.
    pub fn set_chat_template(
        &mut self,
        source: &str,
    ) -> Result<(), crate::model::text::chat_template::ChatTemplateError> {
        let text = |id: Option<u32>| id.and_then(|id| self.id_to_token(id));
        let (bos, eos) = (text(self.bos_id), text(self.eos_ids.first().copied()));
        self.chat_template = Some(ChatTemplate::new(source, bos, eos)?);
        Ok(())
    }

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

    /// Whether the model answers in harmony's channels (gpt-oss): its vocabulary has harmony's
    /// markers as special tokens.
    pub fn answers_in_harmony(&self) -> bool {
        crate::model::text::harmony::SPECIAL_TOKENS
            .iter()
            .all(|t| self.token_to_id(t).is_some_and(|id| self.is_special(id)))
    }
}
