//! Drafting across vocabularies (Token-Level Intersection, Timor et al. 2025): a draft model
//! of another family proposes only the tokens both vocabularies hold as the same text.
//!
//! Why it exists: the rejection rule compares q and p token by token in the target's ids. TLI
//! makes q a distribution over target ids (the drafter's softmax restricted to the shared
//! tokens and renormalized there, every other target token at 0), so the ordinary rule keeps
//! the target's distribution exactly, greedy and sampled. The drafter reads the target's text
//! in its own tokens: each target token becomes the drafter's id of the same text where they
//! share it, else the drafter's tokenization of its bytes. Token by token, so a context's
//! translation extends its prefix's and rolling back is cutting at a length.

use std::collections::HashMap;
use std::sync::Arc;

use super::DraftError;
use crate::model::text::vocab_map::VocabMap;
use crate::model::{TextTokenizer, TokenizerError};

/// A few paragraphs of ordinary text and code, for the share of a target's tokens a drafter
/// could propose (`Translation::sample_coverage`); written for this, unrelated to any
/// benchmark.
const COVERAGE_SAMPLE: &str = include_str!("coverage_sample.txt");

/// Below this share of a target's tokens of [`COVERAGE_SAMPLE`], a drafter of another
/// vocabulary is refused: a drafted run ends at the first token it cannot propose, so even a
/// drafter always right accepts on average under `c / (1 - c)` tokens a round at coverage
/// `c` (1 at one half), less than a drafter's steps cost.
pub const MIN_COVERAGE: f64 = 0.5;

/// How a drafter of another vocabulary drafts for a greedy request
/// (`speculation.cross_vocabulary`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GreedyAcross {
    /// Token-level intersection: the best shared token, as for sampled requests (`tli`).
    #[default]
    TokenLevel,
    /// String-level exact match: the drafter's own best tokens, their text then put in the
    /// target's tokens (`slem`): a word the target holds whole but the drafter only in pieces
    /// can be drafted. Greedy verification keeps the output exactly plain decoding's.
    StringLevel,
}

impl std::str::FromStr for GreedyAcross {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "tli" => Ok(Self::TokenLevel),
            "slem" => Ok(Self::StringLevel),
            other => Err(format!("must be tli or slem, got `{other}`")),
        }
    }
}

/// The shared tokens as columns: a drafter row's logits at `draft_ids`, read as the logits of
/// `target_ids` (the same texts).
#[derive(Clone, Debug)]
pub struct SharedColumns {
    draft_ids: Vec<u32>,
    target_ids: Vec<u32>,
}

impl SharedColumns {
    /// The pairs of `map` whose ids the two models have rows for (a tokenizer may know more
    /// ids than a model's output head).
    pub fn new(map: &VocabMap, draft_rows: usize, target_rows: usize) -> Self {
        let (draft_ids, target_ids) = map
            .pairs()
            .filter(|&(d, t)| (d as usize) < draft_rows && (t as usize) < target_rows)
            .unzip();
        Self {
            draft_ids,
            target_ids,
        }
    }

    /// The shared tokens' target ids, in column order.
    pub fn target_ids(&self) -> &[u32] {
        &self.target_ids
    }

    /// Writes `draft_row`'s logits of the shared tokens to `out`, in column order.
    pub fn gather(&self, draft_row: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend(self.draft_ids.iter().map(|&d| draft_row[d as usize]));
    }
}

/// What a drafter of another vocabulary needs: the shared columns, the map both ways, and
/// both tokenizers for the target tokens it does not share.
#[derive(Clone)]
pub struct Translation {
    map: VocabMap,
    columns: SharedColumns,
    draft: Arc<TextTokenizer>,
    target: Arc<TextTokenizer>,
    /// The drafter's id of each single byte, for text that is not UTF-8 on its own.
    byte_ids: Vec<Option<u32>>,
    draft_rows: usize,
    target_rows: usize,
    greedy: GreedyAcross,
}

impl Translation {
    /// The translation between a drafter (`draft`, its model's `draft_rows` output rows) and a
    /// target (`target`, `target_rows`).
    pub fn between(
        draft: Arc<TextTokenizer>,
        draft_rows: usize,
        target: Arc<TextTokenizer>,
        target_rows: usize,
    ) -> Result<Self, TokenizerError> {
        // Only the ids both models have rows for (a tokenizer may know more).
        let columns = SharedColumns::new(
            &VocabMap::between(&draft, &target)?,
            draft_rows,
            target_rows,
        );
        let pairs: Vec<(u32, u32)> = columns
            .draft_ids
            .iter()
            .copied()
            .zip(columns.target_ids.iter().copied())
            .collect();
        let map = VocabMap::from_pairs(draft_rows, target_rows, &pairs);
        let mut byte_ids = vec![None; 256];
        for id in (0..draft.vocab_size().min(draft_rows) as u32).rev() {
            if draft.is_special(id) {
                continue;
            }
            if let Ok([b]) = draft.token_bytes(id).as_deref() {
                byte_ids[*b as usize] = Some(id);
            }
        }
        Ok(Self {
            map,
            columns,
            draft,
            target,
            byte_ids,
            draft_rows,
            target_rows,
            greedy: GreedyAcross::default(),
        })
    }

    /// Drafts for greedy requests as `greedy` says.
    pub fn with_greedy(mut self, greedy: GreedyAcross) -> Self {
        self.greedy = greedy;
        self
    }

    pub fn greedy(&self) -> GreedyAcross {
        self.greedy
    }

    /// Whether drafter token `id` is a control token (a string-level draft ends before it).
    pub fn is_draft_control(&self, id: u32) -> bool {
        self.draft.is_special(id)
    }

    /// The target's tokens for the text of the drafter's `ids` (string-level drafts): their
    /// bytes, cut before a UTF-8 character they end inside, tokenized by the target.
    pub fn retokenize(&self, ids: &[u32]) -> Result<Vec<u32>, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend(self.draft.token_bytes(id)?);
        }
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).expect("valid up to there"),
        };
        let mut out = self.target.encode(text, false)?;
        out.retain(|&t| (t as usize) < self.target_rows);
        Ok(out)
    }

    /// How many tokens the drafter can propose.
    pub fn shared(&self) -> usize {
        self.columns.target_ids.len()
    }

    /// The share of `target_ids` the drafter could propose.
    pub fn coverage(&self, target_ids: &[u32]) -> f64 {
        self.map.coverage(target_ids)
    }

    /// The share of `target_ids`' text tokens the drafter could propose, control tokens (a
    /// chat template's turn markers) left out: they say nothing of the text. `None` where
    /// there is no text token.
    pub fn text_coverage(&self, target_ids: &[u32]) -> Option<f64> {
        let (mut text, mut covered) = (0usize, 0usize);
        for &id in target_ids {
            if self.target.is_special(id) {
                continue;
            }
            text += 1;
            covered += usize::from(self.map.draft_of(id).is_some());
        }
        (text > 0).then(|| covered as f64 / text as f64)
    }

    /// The share of the target's tokens of a built-in sample of ordinary text and code.
    pub fn sample_coverage(&self) -> Result<f64, TokenizerError> {
        Ok(self.coverage(&self.target.encode(COVERAGE_SAMPLE, false)?))
    }

    pub fn columns(&self) -> &SharedColumns {
        &self.columns
    }

    /// The target's vocabulary (the proposals' ids).
    pub fn target_rows(&self) -> usize {
        self.target_rows
    }

    /// The drafter's id of a shared target token.
    pub fn draft_of(&self, target_id: u32) -> Option<u32> {
        self.map.draft_of(target_id)
    }

    /// The drafter's tokens for the target's `ids`, as a drafting sequence reads them.
    pub fn translate(&self, ids: &[u32]) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            out.extend(self.pieces(id)?);
        }
        Ok(out)
    }

    /// How many of the drafter's tokens target token `id` becomes as a drafting sequence reads
    /// it (one where the drafter has the token; a token whose pieces cannot be worked out
    /// counts as one).
    pub fn piece_count(&self, id: u32) -> usize {
        match self.draft_of(id) {
            Some(_) => 1,
            None => self.pieces(id).map_or(1, |p| p.len()),
        }
    }

    /// The drafter's tokens for target token `id`: its own id of the same text, else its
    /// tokenization of the token's bytes (byte by byte where they are not UTF-8 alone); the
    /// target's BOS is the drafter's where it uses one, else nothing.
    fn pieces(&self, id: u32) -> Result<Vec<u32>, TokenizerError> {
        if let Some(d) = self.draft_of(id) {
            return Ok(vec![d]);
        }
        if Some(id) == self.target.bos_id() {
            return Ok(self
                .draft
                .bos_id()
                .filter(|_| self.draft.adds_bos())
                .into_iter()
                .collect());
        }
        let bytes = self.target.token_bytes(id)?;
        let ids = match std::str::from_utf8(&bytes) {
            Ok(text) => self.draft.encode(text, false)?,
            Err(_) => bytes
                .iter()
                .filter_map(|&b| self.byte_ids[b as usize])
                .collect(),
        };
        Ok(ids
            .into_iter()
            .filter(|&d| (d as usize) < self.draft_rows)
            .collect())
    }
}

/// One sequence's text in both vocabularies: the target tokens translated so far, the drafter
/// tokens they became, and where each target token's translation ends.
#[derive(Default)]
struct Translated {
    target: Vec<u32>,
    draft: Vec<u32>,
    ends: Vec<usize>,
}

impl Translated {
    /// Keeps the first `n` target tokens' translation.
    fn cut(&mut self, n: usize) {
        let n = n.min(self.target.len());
        self.target.truncate(n);
        self.ends.truncate(n);
        self.draft.truncate(self.ends.last().copied().unwrap_or(0));
    }
}

/// A drafter's translations of its sequences, with the pieces of unshared target tokens it
/// has worked out (kept: a text's rare tokens recur).
pub(super) struct Translator {
    translation: Arc<Translation>,
    pieces: HashMap<u32, Box<[u32]>>,
    seqs: HashMap<u64, Translated>,
}

impl Translator {
    pub fn new(translation: Arc<Translation>) -> Self {
        Self {
            translation,
            pieces: HashMap::new(),
            seqs: HashMap::new(),
        }
    }

    pub fn translation(&self) -> &Arc<Translation> {
        &self.translation
    }

    /// `seq`'s `context` (target ids) in the drafter's tokens, extending what was translated
    /// of it before where the context agrees.
    pub fn translate(&mut self, seq: u64, context: &[u32]) -> Result<&[u32], DraftError> {
        let t = self.seqs.entry(seq).or_default();
        let same = t
            .target
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        t.cut(same);
        for &id in &context[same..] {
            let piece = match self.pieces.get(&id) {
                Some(p) => p,
                None => {
                    let p = self.translation.pieces(id)?;
                    self.pieces.entry(id).or_insert(p.into_boxed_slice())
                }
            };
            t.draft.extend_from_slice(piece);
            t.target.push(id);
            t.ends.push(t.draft.len());
        }
        Ok(&t.draft)
    }

    /// How many drafter tokens the first `len` target tokens of `seq` became (what of its
    /// translation is known).
    pub fn draft_len(&self, seq: u64, len: usize) -> usize {
        match self.seqs.get(&seq) {
            Some(t) if len > 0 && !t.ends.is_empty() => t.ends[len.min(t.ends.len()) - 1],
            _ => 0,
        }
    }

    pub fn forget(&mut self, seq: u64) {
        self.seqs.remove(&seq);
    }
}

#[cfg(test)]
mod tests;
