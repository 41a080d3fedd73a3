//! SentencePiece vocabularies as GGUF stores them (`tokenizer.ggml.model = "llama"`: Gemma,
//! Mistral, Phi-3, Llama 2): pieces with scores, `▁` for a space, `<0xXX>` byte tokens, and no
//! merge list.
//!
//! llama.cpp tokenizes these by repeatedly joining the adjacent pair whose joined text is the
//! highest-scoring piece. That is byte-pair encoding with one merge per way of splitting a
//! piece into two pieces, ranked by the joined piece's score, which is what this builds for
//! the `tokenizers` BPE model (with byte fallback for characters no piece holds). The ids are
//! checked against llama.cpp's own tokenizer on the real Gemma 3 vocabulary (`tests/`).

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{
    NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence,
};
use tokenizers::Tokenizer;

use super::TokenizerError;

/// The space stand-in of SentencePiece pieces.
pub(super) const SPACE: char = '\u{2581}';

// GGUF token types (llama.cpp's `llama_token_type`) that never come out of merging text.
const TYPE_UNKNOWN: u32 = 2;
const TYPE_CONTROL: u32 = 3;
const TYPE_BYTE: u32 = 6;

/// The vocabulary's pieces and what goes with them.
pub(super) struct Pieces<'a> {
    pub tokens: &'a [&'a str],
    pub scores: &'a [f32],
    /// One type per token, or empty when the file has none.
    pub types: &'a [u32],
    /// Whether text gets a `▁` in front before tokenizing (Llama 2, Mistral; not Gemma).
    pub add_space_prefix: bool,
    pub unknown: Option<&'a str>,
}

/// The BPE model, normalizer and decoder that tokenize as llama.cpp's SentencePiece
/// tokenizer does.
pub(super) fn sentencepiece_tokenizer(p: &Pieces) -> Result<Tokenizer, TokenizerError> {
    let vocab: HashMap<String, u32> = p
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| ((*t).to_owned(), id as u32))
        .collect();
    let merges = merges(p, &vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .byte_fallback(true);
    if let Some(unk) = p.unknown {
        builder = builder.unk_token(unk.to_owned());
    }
    let bpe = builder
        .build()
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
    let mut inner = Tokenizer::new(bpe);
    let build = |e: tokenizers::Error| TokenizerError::Build(e.to_string());
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if p.add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
    }
    normalizers.push(Replace::new(" ", SPACE.to_string()).map_err(build)?.into());
    inner
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(build)?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        DecoderWrapper::Replace(Replace::new(SPACE.to_string(), " ").map_err(build)?),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if p.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// Every split of a mergeable piece into two pieces, the highest-scoring joined piece first
/// (ties by id, as llama.cpp's queue would meet them left to right).
fn merges(p: &Pieces, vocab: &HashMap<String, u32>) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, String, String)> = Vec::new();
    for (id, piece) in p.tokens.iter().enumerate() {
        let ty = p.types.get(id).copied().unwrap_or(1);
        if matches!(ty, TYPE_UNKNOWN | TYPE_CONTROL | TYPE_BYTE) {
            continue;
        }
        let score = p.scores.get(id).copied().unwrap_or(0.0);
        for (cut, _) in piece.char_indices().skip(1) {
            let (a, b) = piece.split_at(cut);
            if vocab.contains_key(a) && vocab.contains_key(b) {
                ranked.push((score, id as u32, a.to_owned(), b.to_owned()));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    ranked.into_iter().map(|(_, _, a, b)| (a, b)).collect()
}

/// The bytes an SPM piece stands for: a byte token's byte, else its text with `▁` a space.
pub(super) fn piece_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2)
    {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    piece.replace(SPACE, " ").into_bytes()
}
