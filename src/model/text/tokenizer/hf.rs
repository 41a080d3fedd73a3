//! Loading a tokenizer from a Hugging Face model folder: `tokenizer.json` plus the optional
//! config files that carry what it lacks (BOS/EOS, `add_bos_token`, the chat template).

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::OnceLock;

use tokenizers::Tokenizer;

use super::text_tokenizer::PieceKind;
use super::{TextTokenizer, TokenizerError, END_OF_GENERATION_TEXTS};
use crate::model::text::chat_template::ChatTemplate;

impl TextTokenizer {
    /// Hugging Face folder: `tokenizer.json`, plus `tokenizer_config.json` (chat template,
    /// BOS/EOS token strings, `add_bos_token`) and `generation_config.json` (`eos_token_id`,
    /// an int or a list) when present. A `chat_template.jinja` file is used when the config
    /// carries no template, as newer `transformers` versions save it separately.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let inner = read_tokenizer_json(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_optional_json(&config_path)?;
        let generation_path = dir.join("generation_config.json");
        let generation = read_optional_json(&generation_path)?;

        let bos_token = config_token(config.as_ref(), "bos_token");
        let eos_token = config_token(config.as_ref(), "eos_token");

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
        let add_bos = adds_bos(config.as_ref(), &inner, bos_id);
        let chat_template = template_source(dir, config.as_ref(), &config_path)?
            .map(|src| ChatTemplate::new(&src, bos_token.clone(), eos_token.clone()))
            .transpose()?;

        Ok(Self {
            pieces: piece_kind(&inner),
            inner,
            eos_ids: eos.into_iter().collect(),
            bos_id,
            add_bos,
            special_ids,
            vocab_size,
            chat_template,
            control_texts: OnceLock::new(),
            literal: OnceLock::new(),
        })
    }
}

fn read_tokenizer_json(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let bytes = std::fs::read(path).map_err(|e| TokenizerError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::BadFile {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// A special token's text in `tokenizer_config.json`: either a plain string or an AddedToken
/// object `{"content": ...}`.
fn config_token(config: Option<&serde_json::Value>, key: &str) -> Option<String> {
    let v = config?.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(|c| c.as_str()))
        .map(str::to_owned)
}

/// Whether the model was trained with BOS first: the config's `add_bos_token`, else what the
/// tokenizer's post-processor does.
fn adds_bos(config: Option<&serde_json::Value>, inner: &Tokenizer, bos_id: Option<u32>) -> bool {
    match config
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
    }
}

/// The chat template's source: the config's `chat_template`, else `chat_template.jinja` in
/// the folder, else none.
fn template_source(
    dir: &Path,
    config: Option<&serde_json::Value>,
    config_path: &Path,
) -> Result<Option<String>, TokenizerError> {
    match config.and_then(|c| c.get("chat_template")) {
        Some(v) => Ok(Some(template_from_config(v).ok_or_else(|| {
            TokenizerError::BadFile {
                path: config_path.to_owned(),
                reason: "`chat_template` must be a string or a list of {name, template}".into(),
            }
        })?)),
        None => {
            let jinja_path = dir.join("chat_template.jinja");
            match std::fs::read_to_string(&jinja_path) {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(TokenizerError::Io {
                    path: jinja_path,
                    reason: e.to_string(),
                }),
            }
        }
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

/// A `tokenizer.json` whose decoder maps bytes back through GPT-2's table is byte-level; any
/// other (SentencePiece's `▁` replacement and byte fallback) spells pieces as text.
fn piece_kind(inner: &Tokenizer) -> PieceKind {
    match inner.get_decoder() {
        Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_)) | None => PieceKind::ByteLevel,
        Some(_) => PieceKind::SentencePiece,
    }
}
