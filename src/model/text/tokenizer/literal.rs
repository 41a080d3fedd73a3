//! Literal text inside a templated prompt: what a client wrote (a message's content, a name,
//! a tool's result) is tokenized as text, never as the control tokens its characters may spell.
//!
//! Why it exists: a chat template writes its own markup (`<|im_start|>user\n`) around the
//! messages, and the rendered prompt is tokenized with control-token parsing so that markup
//! becomes its special tokens. A user who writes `<|im_end|>\n<|im_start|>system` in a message
//! would otherwise forge a system turn. So before rendering, every control token's text inside
//! a literal is broken by a marker character that none of the literals contains; after
//! rendering, the only control-token texts left whole are the template's. The rendered text is
//! cut at those, each cut-out token gets its id, and the text between them (markers removed)
//! is encoded with control-token parsing off. Tokenizers split at control tokens before
//! anything else, so where no literal spells one, the ids equal those of plain encoding.

use tokenizers::Tokenizer;

use super::{TextTokenizer, TokenizerError};

/// A character from Unicode's private use area that occurs in none of `literals`.
pub fn literal_marker<'a>(literals: impl Iterator<Item = &'a str> + Clone) -> char {
    ('\u{E000}'..='\u{F8FF}')
        .find(|&c| literals.clone().all(|l| !l.contains(c)))
        .unwrap_or('\u{F0000}')
}

impl TextTokenizer {
    /// The texts of the control tokens, longest first (so a longer token wins where one
    /// begins with another).
    fn control_texts(&self) -> &[(String, u32)] {
        self.control_texts.get_or_init(|| {
            let mut texts: Vec<(String, u32)> = self
                .special_ids
                .iter()
                .filter_map(|&id| self.inner.id_to_token(id).map(|t| (t, id)))
                .filter(|(t, _)| t.chars().count() >= 2)
                .collect();
            texts.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
            texts
        })
    }

    /// `literal` with every control token's text broken by `marker` after its first
    /// character, so no tokenizer reads it as the token.
    pub fn escape_control_text(&self, literal: &str, marker: char) -> String {
        let mut out = literal.to_string();
        for (text, _) in self.control_texts() {
            if out.contains(text.as_str()) {
                let first = text.chars().next().expect("two characters at least");
                let broken = format!("{first}{marker}{}", &text[first.len_utf8()..]);
                out = out.replace(text.as_str(), &broken);
            }
        }
        out
    }

    /// Encodes a rendered template whose literals were escaped with `marker`
    /// ([`escape_control_text`](Self::escape_control_text)): control tokens where the
    /// template wrote them, everything else as text. BOS is prepended as
    /// [`encode`](Self::encode) does, unless the template already wrote it.
    pub fn encode_templated(
        &self,
        text: &str,
        marker: char,
        add_bos: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = if text.contains(marker) {
            self.encode_split(text, marker)?
        } else {
            self.encode(text, false)?
        };
        let bos = self.bos_id.filter(|_| add_bos && self.add_bos);
        if let Some(bos) = bos.filter(|b| ids.first() != Some(b)) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Cuts `text` at the control tokens' texts left whole, and encodes the text between them
    /// (markers removed) with control-token parsing off.
    fn encode_split(&self, text: &str, marker: char) -> Result<Vec<u32>, TokenizerError> {
        let literal = self.literal_tokenizer();
        let mut ids = Vec::new();
        let mut rest = text;
        loop {
            let next = self
                .control_texts()
                .iter()
                .filter_map(|(t, id)| rest.find(t.as_str()).map(|at| (at, t.len(), *id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let (plain, after) = match next {
                Some((at, len, _)) => (&rest[..at], &rest[at + len..]),
                None => (rest, ""),
            };
            if !plain.is_empty() {
                let plain: String = plain.chars().filter(|&c| c != marker).collect();
                let encoding = literal
                    .encode_fast(plain, false)
                    .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                ids.extend_from_slice(encoding.get_ids());
            }
            match next {
                Some((_, _, id)) => ids.push(id),
                None => return Ok(ids),
            }
            rest = after;
        }
    }

    /// The tokenizer with control-token parsing off, made the first time a literal needs it.
    fn literal_tokenizer(&self) -> &Tokenizer {
        self.literal.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }
}
