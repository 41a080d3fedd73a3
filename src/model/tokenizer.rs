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

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::chat_template::{ChatTemplate, ChatTemplateError};

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

/// Llama 3's split regex, as in its `tokenizer.json`.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: u32 = 3;
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

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
    /// Hugging Face folder: `tokenizer.json`, plus `tokenizer_config.json` (chat template,
    /// BOS/EOS token strings, `add_bos_token`) and `generation_config.json` (`eos_token_id`,
    /// an int or a list) when present. A `chat_template.jinja` file is used when the config
    /// carries no template, as newer `transformers` versions save it separately.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tokenizer_path).map_err(|e| TokenizerError::Io {
            path: tokenizer_path.clone(),
            reason: e.to_string(),
        })?;
        let inner = Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::BadFile {
            path: tokenizer_path.clone(),
            reason: e.to_string(),
        })?;

        let config_path = dir.join("tokenizer_config.json");
        let config = read_optional_json(&config_path)?;
        let generation_path = dir.join("generation_config.json");
        let generation = read_optional_json(&generation_path)?;

        let token_string = |key: &str| -> Option<String> {
            // Either a plain string or an AddedToken object `{"content": ...}`.
            let v = config.as_ref()?.get(key)?;
            v.as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))
                .map(str::to_owned)
        };
        let bos_token = token_string("bos_token");
        let eos_token = token_string("eos_token");

        let special_ids: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();

        let vocab = inner.get_vocab(true);
        let max_id = vocab.values().copied().max();
        // Ids may have gaps; the logits row is as wide as the largest id, not the count.
        let vocab_size = inner
            .get_vocab_size(true)
            .max(max_id.map_or(0, |m| m as usize + 1));

        let mut eos: BTreeSet<u32> = BTreeSet::new();
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos.insert(id);
        }
        if let Some(v) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
            for id in json_ids(v).ok_or_else(|| TokenizerError::BadFile {
                path: generation_path.clone(),
                reason: format!("`eos_token_id` must be an integer or a list of integers, got {v}"),
            })? {
                eos.insert(id);
            }
        }
        for text in END_OF_GENERATION_TEXTS {
            if let Some(id) = vocab.get(*text) {
                if special_ids.contains(id) {
                    eos.insert(*id);
                }
            }
        }

        let bos_id = bos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .or_else(|| {
                let v = generation.as_ref()?.get("bos_token_id")?;
                u32::try_from(v.as_u64()?).ok()
            });

        let add_bos = match config
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(|v| v.as_bool())
        {
            Some(flag) => flag,
            // Llama 3's config has no `add_bos_token`; its post-processor adds BOS instead.
            // Encoding the empty string through it reveals which behaviour the model has.
            None => match bos_id {
                Some(bos) => inner
                    .encode("", true)
                    .map(|e| e.get_ids().first() == Some(&bos))
                    .unwrap_or(false),
                None => false,
            },
        };

        let template_source = match config.as_ref().and_then(|c| c.get("chat_template")) {
            Some(v) => Some(
                template_from_config(v).ok_or_else(|| TokenizerError::BadFile {
                    path: config_path.clone(),
                    reason: "`chat_template` must be a string or a list of {name, template}".into(),
                })?,
            ),
            None => {
                let jinja_path = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&jinja_path) {
                    Ok(s) => Some(s),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => {
                        return Err(TokenizerError::Io {
                            path: jinja_path,
                            reason: e.to_string(),
                        })
                    }
                }
            }
        };
        let chat_template = template_source
            .map(|src| ChatTemplate::new(&src, bos_token.clone(), eos_token.clone()))
            .transpose()?;

        Ok(Self {
            inner,
            eos_ids: eos.into_iter().collect(),
            bos_id,
            add_bos,
            special_ids,
            vocab_size,
            chat_template,
        })
    }

    /// Built from GGUF `tokenizer.ggml.*` metadata. Only byte-level BPE (`gpt2`) with a known
    /// pre-tokenizer is accepted.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let meta = Metadata(content);
        let model = meta.required_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        // Absent in GGUFs converted before llama.cpp recorded it; those were GPT-2 style.
        let pre_name = meta.str("tokenizer.ggml.pre")?.unwrap_or("gpt2");
        let pre = pre_tokenizer_for(pre_name)?;

        let tokens = meta.str_array("tokenizer.ggml.tokens")?;
        let merges_key = "tokenizer.ggml.merges";
        let merges = meta
            .str_array(merges_key)?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| TokenizerError::BadMetadata {
                        key: merges_key.into(),
                        reason: format!("merge `{m}` is not two space-separated tokens"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let vocab_size = tokens.len();
        let id_of = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match meta.u32(key)? {
                Some(id) if (id as usize) < vocab_size => Ok(Some(id)),
                Some(id) => Err(TokenizerError::BadMetadata {
                    key: key.into(),
                    reason: format!("token id {id} is outside the vocabulary of {vocab_size}"),
                }),
                None => Ok(None),
            }
        };
        let token_types: Vec<u32> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let types = v
                    .to_vec()
                    .map_err(|e| bad(key, e))?
                    .iter()
                    .map(|t| value_u32(t).ok_or_else(|| bad(key, "not an integer")))
                    .collect::<Result<Vec<_>, _>>()?;
                if types.len() != vocab_size {
                    return Err(bad(
                        key,
                        format!("{} entries for {vocab_size} tokens", types.len()),
                    ));
                }
                types
            }
            None => Vec::new(),
        };

        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| ((*t).to_owned(), id as u32))
            .collect();
        let ignore_merges =
            pre.ignore_merges || meta.bool("tokenizer.ggml.ignore_merges")?.unwrap_or(false);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.pre_tokenizer));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(
            false, true, true,
        ))));

        // Control and user-defined tokens are written literally in prompts (chat markup), so
        // they must be matched as whole tokens before BPE sees the text. Only control tokens
        // count as special; user-defined ones are ordinary text that merely has its own id.
        let mut special_ids = HashSet::new();
        let mut control = Vec::new();
        let mut user_defined = Vec::new();
        for (id, ty) in token_types.iter().enumerate() {
            let text = tokens[id];
            match *ty {
                TOKEN_TYPE_CONTROL => {
                    special_ids.insert(id as u32);
                    control.push(AddedToken::from(text, true));
                }
                TOKEN_TYPE_USER_DEFINED => {
                    user_defined.push(AddedToken::from(text, false).normalized(false));
                }
                _ => {}
            }
        }
        inner
            .add_special_tokens(control)
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        inner
            .add_tokens(user_defined)
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut eos = BTreeSet::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = id_of(key)? {
                eos.insert(id);
            }
        }
        for (id, text) in tokens.iter().enumerate() {
            if special_ids.contains(&(id as u32)) && END_OF_GENERATION_TEXTS.contains(text) {
                eos.insert(id as u32);
            }
        }

        let bos_id = id_of("tokenizer.ggml.bos_token_id")?;
        let eos_id = id_of("tokenizer.ggml.eos_token_id")?;
        // llama.cpp's default for byte-level BPE vocabularies when the flag is absent.
        let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);

        let chat_template = meta
            .str("tokenizer.chat_template")?
            .map(|src| {
                ChatTemplate::new(
                    src,
                    bos_id.map(|id| tokens[id as usize].to_owned()),
                    eos_id.map(|id| tokens[id as usize].to_owned()),
                )
            })
            .transpose()?;

        Ok(Self {
            inner,
            eos_ids: eos.into_iter().collect(),
            bos_id,
            add_bos,
            special_ids,
            vocab_size,
            chat_template,
        })
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
}

/// Pre-tokenizer settings for one `tokenizer.ggml.pre` value.
struct PreTokenizerSpec {
    pre_tokenizer: PreTokenizerWrapper,
    /// Use a whole pre-token directly when it is in the vocabulary (Llama 3 does).
    ignore_merges: bool,
}

/// The table of supported `tokenizer.ggml.pre` values, mirroring how llama.cpp
/// (`llama-vocab.cpp`) splits text for each and the matching `tokenizer.json` pre-tokenizers.
fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerSpec, TokenizerError> {
    // GPT-2's regex inside ByteLevel; no prefix space, or "hello" would become "Ġhello".
    let gpt2 = || ByteLevel::new(false, true, true);
    let spec = match pre {
        "gpt2" | "mpt" | "olmo" => PreTokenizerSpec {
            pre_tokenizer: gpt2().into(),
            ignore_merges: false,
        },
        // llama.cpp: `\p{N}` then the GPT-2 regex; tokenizer.json: Digits(individual) then
        // ByteLevel. Every digit is its own token.
        "smollm" | "starcoder" | "refact" | "codeshell" => PreTokenizerSpec {
            pre_tokenizer: Sequence::new(vec![Digits::new(true).into(), gpt2().into()]).into(),
            ignore_merges: false,
        },
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" => {
            let split = Split::new(
                SplitPattern::Regex(LLAMA3_REGEX.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
            PreTokenizerSpec {
                pre_tokenizer: Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into(),
                ignore_merges: true,
            }
        }
        other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_owned())),
    };
    Ok(spec)
}

fn bad(key: &str, reason: impl fmt::Display) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

/// GGUF writers disagree on integer widths for ids and types; accept any that fits.
fn value_u32(v: &gguf_file::Value) -> Option<u32> {
    use gguf_file::Value as V;
    match v {
        V::U8(x) => Some(u32::from(*x)),
        V::U16(x) => Some(u32::from(*x)),
        V::U32(x) => Some(*x),
        V::U64(x) => u32::try_from(*x).ok(),
        V::I8(x) => u32::try_from(*x).ok(),
        V::I16(x) => u32::try_from(*x).ok(),
        V::I32(x) => u32::try_from(*x).ok(),
        V::I64(x) => u32::try_from(*x).ok(),
        _ => None,
    }
}

/// Typed access to GGUF metadata; a present key of the wrong type is an error, not "absent".
struct Metadata<'a>(&'a gguf_file::Content);

impl<'a> Metadata<'a> {
    fn str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.0.metadata.get(key) {
            Some(v) => v
                .to_string()
                .map(|s| Some(s.as_str()))
                .map_err(|e| bad(key, e)),
            None => Ok(None),
        }
    }

    fn required_str(&self, key: &str) -> Result<&'a str, TokenizerError> {
        self.str(key)?
            .ok_or_else(|| TokenizerError::MissingMetadata(key.to_owned()))
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        match self.0.metadata.get(key) {
            Some(v) => value_u32(v)
                .map(Some)
                .ok_or_else(|| bad(key, format!("expected a token id, got {v:?}"))),
            None => Ok(None),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.0.metadata.get(key) {
            Some(v) => v.to_bool().map(Some).map_err(|e| bad(key, e)),
            None => Ok(None),
        }
    }

    fn str_array(&self, key: &str) -> Result<Vec<&'a str>, TokenizerError> {
        let v = self
            .0
            .metadata
            .get(key)
            .ok_or_else(|| TokenizerError::MissingMetadata(key.to_owned()))?;
        v.to_vec()
            .map_err(|e| bad(key, e))?
            .iter()
            .map(|s| s.to_string().map(String::as_str).map_err(|e| bad(key, e)))
            .collect()
    }
}

fn read_optional_json(path: &Path) -> Result<Option<serde_json::Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TokenizerError::Io {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::BadFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// `eos_token_id` in `generation_config.json`: an integer or a list of integers.
fn json_ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        serde_json::Value::Array(items) => items.iter().map(one).collect(),
        serde_json::Value::Null => Some(Vec::new()),
        other => one(other).map(|id| vec![id]),
    }
}

/// `chat_template` is either the template itself or a list of named templates, of which the
/// one named "default" is the chat template.
fn template_from_config(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// Streaming detokenizer: feed generated ids one at a time and get back only text that is
/// complete.
///
/// A byte-level token can end in the middle of a UTF-8 character, and decoding it alone
/// gives U+FFFD. As in Hugging Face text-generation-inference, the decoder remembers two
/// offsets: `prefix_offset..read_offset` is the window already emitted, decoded again only
/// for context, and text is emitted once decoding `prefix_offset..` gives more than the
/// window did and does not end in a replacement character.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let (prefix, full) = match self.decode_window(tok) {
            Ok(window) => window,
            Err(e) => {
                // Leave the decoder as it was, so one bad id does not poison the stream.
                self.ids.pop();
                return Err(e);
            }
        };
        if full.len() > prefix.len() && !full.ends_with(char::REPLACEMENT_CHARACTER) {
            let new_text = suffix_after(&full, &prefix).to_owned();
            // The window now starts at what was just emitted; everything before it is never
            // decoded again, so it is dropped to keep memory flat over long generations.
            let consumed = self.read_offset;
            self.ids.drain(..consumed);
            self.prefix_offset = 0;
            self.read_offset = self.ids.len();
            Ok(Some(new_text))
        } else {
            Ok(None)
        }
    }

    /// Emits whatever is still held back (at the end of generation), even if it ends in an
    /// incomplete character.
    pub fn flush(&mut self, tok: &TextTokenizer) -> Result<Option<String>, TokenizerError> {
        if self.read_offset >= self.ids.len() {
            return Ok(None);
        }
        let (prefix, full) = self.decode_window(tok)?;
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        let rest = suffix_after(&full, &prefix);
        Ok((!rest.is_empty()).then(|| rest.to_owned()))
    }

    fn decode_window(&self, tok: &TextTokenizer) -> Result<(String, String), TokenizerError> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.prefix_offset..])?;
        Ok((prefix, full))
    }
}

/// The part of `full` after `prefix`. With byte-level decoding `prefix` always is a prefix of
/// `full`; should a decoder ever rewrite earlier text, fall back to the longest common prefix
/// (on a character boundary) instead of panicking.
fn suffix_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut common = full
        .bytes()
        .zip(prefix.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !full.is_char_boundary(common) {
        common -= 1;
    }
    &full[common..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::tokenizer::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn splits(pre: &str, input: &str) -> Vec<String> {
        let spec = pre_tokenizer_for(pre).expect("known pre-tokenizer");
        let mut pretokenized = PreTokenizedString::from(input);
        spec.pre_tokenizer
            .pre_tokenize(&mut pretokenized)
            .expect("pre-tokenize");
        pretokenized
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_owned())
            .collect()
    }

    #[test]
    fn llama3_splits_digits_in_threes_and_keeps_case_insensitive_contractions() {
        assert_eq!(
            splits("llama-bpe", "Hello'VE world 12345\n\n  foo"),
            ["Hello", "'VE", "Ġworld", "Ġ", "123", "45", "ĊĊ", "Ġ", "Ġfoo"]
        );
    }

    #[test]
    fn smollm_splits_every_digit_without_prefix_space() {
        assert_eq!(
            splits("smollm", "hello 2024"),
            ["hello", "Ġ", "2", "0", "2", "4"]
        );
    }

    #[test]
    fn unknown_pre_tokenizer_is_refused() {
        assert!(matches!(
            pre_tokenizer_for("qwen2"),
            Err(TokenizerError::UnsupportedPreTokenizer(name)) if name == "qwen2"
        ));
    }

    #[test]
    fn suffix_after_never_splits_a_character() {
        assert_eq!(suffix_after("abc", "ab"), "c");
        assert_eq!(suffix_after("aé", "a\u{FFFD}"), "é");
    }
}
