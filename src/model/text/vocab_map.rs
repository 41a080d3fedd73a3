//! Which tokens two vocabularies share, and the map between their ids: the ground a drafter of
//! another family stands on (Token-Level Intersection, Timor et al. 2025: the drafter proposes
//! only tokens the target also has as the same text, and the ordinary rejection rule then
//! keeps the target's distribution exactly).
//!
//! "The same text" is the same bytes: a byte-level BPE token's GPT-2 stand-ins and a
//! SentencePiece piece's `▁` and `<0xXX>` spellings are both read back to the bytes they stand
//! for ([`TextTokenizer::token_bytes`]), so SmolLM2's `Ġthe` and Gemma's `▁the` are one token.
//! Control tokens are shared only where both vocabularies spell them alike. Where one
//! vocabulary holds the same bytes under several ids (Gemma's user-defined `\n` beside its byte
//! token `<0x0A>`), the id its tokenizer gives that text alone stands for it, else the first.

use std::collections::HashMap;

use super::tokenizer::{TextTokenizer, TokenizerError};

/// The shared tokens of a drafter's and a target's vocabularies, both ways.
#[derive(Clone, Debug)]
pub struct VocabMap {
    /// Drafter id -> the target id of the same text.
    to_target: Vec<Option<u32>>,
    /// Target id -> the drafter id of the same text.
    to_draft: Vec<Option<u32>>,
}

impl VocabMap {
    /// The intersection of `draft`'s and `target`'s vocabularies by text.
    pub fn between(draft: &TextTokenizer, target: &TextTokenizer) -> Result<Self, TokenizerError> {
        let target_by_text = texts(target)?;
        let draft_by_text = texts(draft)?;
        let mut to_target = vec![None; draft.vocab_size()];
        let mut to_draft = vec![None; target.vocab_size()];
        for (text, &d) in &draft_by_text {
            if let Some(&t) = target_by_text.get(text) {
                to_target[d as usize] = Some(t);
                to_draft[t as usize] = Some(d);
            }
        }
        Ok(Self {
            to_target,
            to_draft,
        })
    }

    /// A map from known pairs `(drafter id, target id)` of vocabularies of `draft` and
    /// `target` tokens (tiny vocabularies in tests, where texts are beside the point).
    pub fn from_pairs(draft: usize, target: usize, pairs: &[(u32, u32)]) -> Self {
        let mut to_target = vec![None; draft];
        let mut to_draft = vec![None; target];
        for &(d, t) in pairs {
            to_target[d as usize] = Some(t);
            to_draft[t as usize] = Some(d);
        }
        Self {
            to_target,
            to_draft,
        }
    }

    /// The shared tokens as `(drafter id, target id)`, in drafter id order.
    pub fn pairs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.to_target
            .iter()
            .enumerate()
            .filter_map(|(d, t)| t.map(|t| (d as u32, t)))
    }

    /// The target's vocabulary size.
    pub fn target_vocab(&self) -> usize {
        self.to_draft.len()
    }

    /// How many tokens the two vocabularies share.
    pub fn shared(&self) -> usize {
        self.to_target.iter().flatten().count()
    }

    /// The target's id of drafter token `id`, where the target has its text.
    pub fn target_of(&self, id: u32) -> Option<u32> {
        self.to_target.get(id as usize).copied().flatten()
    }

    /// The drafter's id of target token `id`, where the drafter has its text.
    pub fn draft_of(&self, id: u32) -> Option<u32> {
        self.to_draft.get(id as usize).copied().flatten()
    }

    /// The share of `target_ids` (a target's own output, say) that the drafter could propose.
    pub fn coverage(&self, target_ids: &[u32]) -> f64 {
        if target_ids.is_empty() {
            return 0.0;
        }
        let covered = target_ids
            .iter()
            .filter(|&&t| self.draft_of(t).is_some())
            .count();
        covered as f64 / target_ids.len() as f64
    }
}

/// Each distinct text of a vocabulary (control tokens marked apart, so they only meet their
/// own kind) and the one id that stands for it.
fn texts(tok: &TextTokenizer) -> Result<HashMap<Vec<u8>, u32>, TokenizerError> {
    let mut by_text: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
    for id in 0..tok.vocab_size() as u32 {
        let Some(_) = tok.id_to_token(id) else {
            continue;
        };
        let mut key = tok.token_bytes(id)?;
        if key.is_empty() {
            continue;
        }
        if tok.is_special(id) {
            key.insert(0, 0xFF);
        }
        by_text.entry(key).or_default().push(id);
    }
    Ok(by_text
        .into_iter()
        .map(|(key, ids)| {
            let id = match ids.as_slice() {
                [one] => *one,
                many => canonical(tok, &key, many),
            };
            (key, id)
        })
        .collect())
}

/// Of several ids with the same text, the one the tokenizer gives that text alone, else the
/// lowest.
fn canonical(tok: &TextTokenizer, text: &[u8], ids: &[u32]) -> u32 {
    let alone = std::str::from_utf8(text)
        .ok()
        .and_then(|s| tok.encode(s, false).ok())
        .filter(|enc| enc.len() == 1 && ids.contains(&enc[0]));
    match alone {
        Some(enc) => enc[0],
        None => *ids.iter().min().expect("at least one id"),
    }
}
