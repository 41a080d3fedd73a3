//! One sequence's grammar state: the masks of a round's rows, drafts checked against the
//! grammar, the tokens the grammar forces, and the output consumed as it is emitted.

use llguidance::Matcher;

use super::reasons::{matcher_reason, reached_limit};
use super::{ConstraintError, TokenMask};

/// A sequence's matcher, advanced by exactly the tokens it emits.
pub struct SequenceConstraint {
    matcher: Matcher,
    vocab: usize,
    /// The tokenizer's vocabulary as the grammar knows it (the model's may be padded past it):
    /// llguidance stops a matcher asked to validate a token past it.
    grammar_vocab: usize,
}

impl std::fmt::Debug for SequenceConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceConstraint").finish_non_exhaustive()
    }
}

/// A matcher's error: a limit reached (the grammar's doing) or a refusal of a token the
/// engine emitted under its own mask (a bug).
fn matcher_error(e: impl std::fmt::Display) -> ConstraintError {
    let line = matcher_reason(&e.to_string());
    if reached_limit(&line) {
        ConstraintError::Exhausted(line)
    } else {
        ConstraintError::Matcher(line)
    }
}

impl SequenceConstraint {
    pub(super) fn new(matcher: Matcher, vocab: usize) -> Self {
        let grammar_vocab = matcher
            .tok_env()
            .map_or(0, |env| env.tok_trie().vocab_size());
        Self {
            matcher,
            vocab,
            grammar_vocab,
        }
    }

    /// An independent copy of this state (the grammar and its caches shared), for a drafter to
    /// advance along its own drafts.
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.clone(),
            vocab: self.vocab,
            grammar_vocab: self.grammar_vocab,
        }
    }

    /// The tokens allowed next (only the end-of-sequence tokens once the grammar is complete).
    /// A failure here is the grammar's: it compiled but needs more work at this point than
    /// llguidance's per-token limits allow.
    pub fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let mut bits = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Exhausted(matcher_reason(&e.to_string())))?;
        if bits.len() < self.vocab {
            bits.resize(self.vocab);
        }
        Ok(TokenMask::new(bits))
    }

    /// Whether the grammar allows `token` next: exactly whether [`Self::mask`] would allow it,
    /// mostly for a parser step's cost instead of a pass over the vocabulary (a greedy row
    /// checks its argmax and computes the mask only when the grammar refuses it).
    ///
    /// The mask is not simply "the tokens the parser accepts": where the grammar forces text,
    /// llguidance allows only the first token of that text's canonical tokenization (not
    /// `"t"` where `"topic"` is forced), and forced bytes that end mid-token must start the
    /// next token. So a free position (no forced bytes, the common case) asks the parser about
    /// the one token, a forced token answers by itself, and other forced bytes defer to the
    /// mask.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.matcher.is_stopped() {
            return Ok(self.mask()?.allows(token));
        }
        if !self.matcher.compute_ff_bytes().is_empty() {
            return Ok(match self.matcher.compute_ff_tokens().first() {
                Some(&first) => token == first,
                None => self.mask()?.allows(token),
            });
        }
        if token as usize >= self.grammar_vocab {
            return Ok(false);
        }
        Ok(self
            .matcher
            .validate_tokens(&[token])
            .map_err(matcher_error)?
            == 1)
    }

    /// How many of `tokens`, from the first, the grammar allows from here.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let known = tokens
            .iter()
            .position(|&t| t as usize >= self.grammar_vocab)
            .unwrap_or(tokens.len());
        if known == 0 || self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(&tokens[..known]).unwrap_or(0)
    }

    /// The tokens the grammar forces from here (llguidance's fast-forward tokens: the forced
    /// bytes in the tokenizer's own tokenization); empty when the next token is a choice.
    pub fn forced(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    /// The masks of a round's rows: `out[i]` is the mask after `tokens[..i]`, for every `i`
    /// up to `tokens.len()`. Past the first token the grammar forbids, the rows get a copy of
    /// that token's row mask: the acceptance rule rejects that token with certainty, so those
    /// rows are never read. Returns how many tokens the grammar allowed; the state is left
    /// where it was.
    pub fn masks_along(
        &mut self,
        tokens: &[u32],
        out: &mut Vec<TokenMask>,
    ) -> Result<usize, ConstraintError> {
        out.clear();
        out.push(self.mask()?);
        let valid = self.valid_prefix(tokens);
        let mut consumed = 0;
        for &t in &tokens[..valid] {
            if self.matcher.is_stopped() {
                break;
            }
            self.matcher.consume_token(t).map_err(matcher_error)?;
            consumed += 1;
            out.push(self.mask()?);
        }
        self.matcher.rollback(consumed).map_err(matcher_error)?;
        while out.len() < tokens.len() + 1 {
            let last = out.last().expect("one mask at least").clone();
            out.push(last);
        }
        Ok(consumed)
    }

    /// Consumes emitted tokens. The end-of-sequence token that ends a complete output, and
    /// anything after the grammar stopped, is not the grammar's to see.
    pub fn advance(&mut self, tokens: &[u32]) -> Result<(), ConstraintError> {
        for &t in tokens {
            if self.matcher.is_stopped() {
                return Ok(());
            }
            // Consuming checks the token too (one parser step, not two); a token the mask
            // allowed is never refused here.
            self.matcher
                .consume_token(t)
                .map_err(|e| match matcher_error(e) {
                    ConstraintError::Matcher(why) => ConstraintError::Matcher(format!(
                        "token {t} was emitted but the grammar does not allow it: {why}"
                    )),
                    other => other,
                })?;
        }
        Ok(())
    }

    /// Whether the output so far is a complete match (the end-of-sequence token is allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}
