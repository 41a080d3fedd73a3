//! Building a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file: the vocabulary,
//! merges and token types it stores, and the pre-tokenizer it only names, looked up in an
//! explicit table.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::spm::{sentencepiece_tokenizer, Pieces};
use super::text_tokenizer::PieceKind;
use super::{TextTokenizer, TokenizerError, END_OF_GENERATION_TEXTS};
use crate::model::text::chat_template::ChatTemplate;

/// Llama 3's split regex, as in its `tokenizer.json`.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's (GPT-4o, gpt-oss; llama.cpp's `gpt-4o`, as its tokenizer.json states it): a word
/// keeps its leading capitals and a trailing contraction, digits go in threes, and a run of
/// punctuation keeps trailing newlines and slashes.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's (and 2.5's, 3's): Llama 3's with every digit on its own.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: u32 = 3;
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

impl TextTokenizer {
    /// Built from GGUF `tokenizer.ggml.*` metadata: byte-level BPE (`gpt2`) with a known
    /// pre-tokenizer, or a SentencePiece vocabulary (`llama`).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let meta = Metadata(content);
        let model = meta.required_str("tokenizer.ggml.model")?;
        let tokens = meta.str_array("tokenizer.ggml.tokens")?;
        let vocab_size = tokens.len();
        let token_types = token_types(content, vocab_size)?;
        let (mut inner, pieces) = match model {
            "gpt2" => {
                // Absent in GGUFs converted before llama.cpp recorded it; those were GPT-2 style.
                let pre_name = meta.str("tokenizer.ggml.pre")?.unwrap_or("gpt2");
                let pre = pre_tokenizer_for(pre_name)?;
                let merges = meta.merges()?;
                (
                    bpe_tokenizer(&meta, &tokens, merges, pre)?,
                    PieceKind::ByteLevel,
                )
            }
            "llama" => {
                let scores = meta.f32_array("tokenizer.ggml.scores")?;
                let unknown = meta.token_id("tokenizer.ggml.unknown_token_id", vocab_size)?;
                let pieces = Pieces {
                    tokens: &tokens,
                    scores: &scores,
                    types: &token_types,
                    // llama.cpp's default for SentencePiece vocabularies.
                    add_space_prefix: meta
                        .bool("tokenizer.ggml.add_space_prefix")?
                        .unwrap_or(true),
                    unknown: unknown.map(|id| tokens[id as usize]),
                };
                (sentencepiece_tokenizer(&pieces)?, PieceKind::SentencePiece)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        };
        let special_ids = add_typed_tokens(&mut inner, &tokens, &token_types)?;
        let eos = end_of_generation_ids(&meta, &tokens, &special_ids)?;

        let bos_id = meta.token_id("tokenizer.ggml.bos_token_id", vocab_size)?;
        let eos_id = meta.token_id("tokenizer.ggml.eos_token_id", vocab_size)?;
        // llama.cpp's defaults when the flag is absent: off for byte-level BPE, on for
        // SentencePiece.
        let add_bos = meta
            .bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(pieces == PieceKind::SentencePiece);

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
            pieces,
            control_texts: OnceLock::new(),
            literal: OnceLock::new(),
        })
    }
}

/// `tokenizer.ggml.token_type`: one type per token, or none when the key is absent.
fn token_types(
    content: &gguf_file::Content,
    vocab_size: usize,
) -> Result<Vec<u32>, TokenizerError> {
    let Some(v) = content.metadata.get("tokenizer.ggml.token_type") else {
        return Ok(Vec::new());
    };
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
    Ok(types)
}

/// The byte-level BPE model over the vocabulary and merges, with the pre-tokenizer and the
/// byte-level decoder.
fn bpe_tokenizer(
    meta: &Metadata,
    tokens: &[&str],
    merges: Vec<(String, String)>,
    pre: PreTokenizerSpec,
) -> Result<Tokenizer, TokenizerError> {
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
    Ok(inner)
}

/// Adds the control and user-defined tokens and returns the special (control) ids.
///
/// Control and user-defined tokens are written literally in prompts (chat markup), so they
/// must be matched as whole tokens before BPE sees the text. Only control tokens count as
/// special; user-defined ones are ordinary text that merely has its own id.
fn add_typed_tokens(
    inner: &mut Tokenizer,
    tokens: &[&str],
    token_types: &[u32],
) -> Result<HashSet<u32>, TokenizerError> {
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
    Ok(special_ids)
}

/// Every id that ends generation: the ones the metadata names, and the control tokens whose
/// text is a known end of generation.
fn end_of_generation_ids(
    meta: &Metadata,
    tokens: &[&str],
    special_ids: &HashSet<u32>,
) -> Result<BTreeSet<u32>, TokenizerError> {
    let mut eos = BTreeSet::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = meta.token_id(key, tokens.len())? {
            eos.insert(id);
        }
    }
    for (id, text) in tokens.iter().enumerate() {
        if special_ids.contains(&(id as u32)) && END_OF_GENERATION_TEXTS.contains(text) {
            eos.insert(id as u32);
        }
    }
    Ok(eos)
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
        "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" => PreTokenizerSpec {
            pre_tokenizer: gpt2().into(),
            ignore_merges: false,
        },
        // llama.cpp: `\p{N}` then the GPT-2 regex; tokenizer.json: Digits(individual) then
        // ByteLevel. Every digit is its own token.
        "smollm" | "starcoder" | "refact" | "codeshell" => PreTokenizerSpec {
            pre_tokenizer: Sequence::new(vec![Digits::new(true).into(), gpt2().into()]).into(),
            ignore_merges: false,
        },
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" => regex_then_bytes(LLAMA3_REGEX, true)?,
        "qwen2" | "deepseek-r1-qwen" => regex_then_bytes(QWEN2_REGEX, false)?,
        "gpt-4o" | "llama4" => regex_then_bytes(GPT4O_REGEX, false)?,
        other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_owned())),
    };
    Ok(spec)
}

/// Split by `regex` (matches kept as pieces), then byte-level BPE without GPT-2's own regex.
fn regex_then_bytes(regex: &str, ignore_merges: bool) -> Result<PreTokenizerSpec, TokenizerError> {
    let split = Split::new(
        SplitPattern::Regex(regex.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerError::Build(e.to_string()))?;
    Ok(PreTokenizerSpec {
        pre_tokenizer: Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, true, false).into(),
        ])
        .into(),
        ignore_merges,
    })
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
        self.array(key, |v| v.to_string().map(String::as_str))
    }

    fn f32_array(&self, key: &str) -> Result<Vec<f32>, TokenizerError> {
        self.array(key, gguf_file::Value::to_f32)
    }

    /// A required array, each element read by `item`.
    fn array<T>(
        &self,
        key: &str,
        item: impl Fn(&'a gguf_file::Value) -> candle_core::Result<T>,
    ) -> Result<Vec<T>, TokenizerError> {
        let v = self
            .0
            .metadata
            .get(key)
            .ok_or_else(|| TokenizerError::MissingMetadata(key.to_owned()))?;
        v.to_vec()
            .map_err(|e| bad(key, e))?
            .iter()
            .map(|s| item(s).map_err(|e| bad(key, e)))
            .collect()
    }

    /// `tokenizer.ggml.merges`: each merge two space-separated tokens.
    fn merges(&self) -> Result<Vec<(String, String)>, TokenizerError> {
        let key = "tokenizer.ggml.merges";
        self.str_array(key)?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| TokenizerError::BadMetadata {
                        key: key.into(),
                        reason: format!("merge `{m}` is not two space-separated tokens"),
                    })
            })
            .collect()
    }

    /// A token id the metadata names, which must be inside the vocabulary.
    fn token_id(&self, key: &str, vocab_size: usize) -> Result<Option<u32>, TokenizerError> {
        match self.u32(key)? {
            Some(id) if (id as usize) < vocab_size => Ok(Some(id)),
            Some(id) => Err(TokenizerError::BadMetadata {
                key: key.into(),
                reason: format!("token id {id} is outside the vocabulary of {vocab_size}"),
            }),
            None => Ok(None),
        }
    }
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
    fn qwen2_splits_every_digit_and_keeps_llama3s_other_rules() {
        assert_eq!(
            splits("qwen2", "Hello'VE world 12345\n\n  foo"),
            ["Hello", "'VE", "Ġworld", "Ġ", "1", "2", "3", "4", "5", "ĊĊ", "Ġ", "Ġfoo"]
        );
    }

    /// The pieces Python's `regex` module gives with the same pattern.
    #[test]
    fn gpt4o_keeps_capitals_and_contractions_in_words_and_slashes_after_punctuation() {
        assert_eq!(
            splits("gpt-4o", "Hello'VE world 12345\n\n  foo"),
            ["Hello'VE", "Ġworld", "Ġ", "123", "45", "ĊĊ", "Ġ", "Ġfoo"]
        );
        assert_eq!(
            splits("gpt-4o", "HTTPServer's URLs/ok?\n"),
            ["HTTPServer's", "ĠURLs", "/ok", "?Ċ"]
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
            pre_tokenizer_for("tekken-9000"),
            Err(TokenizerError::UnsupportedPreTokenizer(name)) if name == "tekken-9000"
        ));
    }
}
