//! One sequence's grammar state: the masks of a round's rows, drafts checked against the
//! grammar, the tokens the grammar forces, and the output consumed as it is emitted.

use llguidance::Matcher;

use super::reasons::{matcher_reason, reached_limit};
use super::{ConstraintError, TokenMask};

/// A sequence's matcher, advanced by exactly the tokens it emits.
pub struct SequenceConstraint {
    matcher: Matcher,
    vocab: usize,
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
        Self { matcher, vocab }
    }

    /// An independent copy of this state (the grammar and its caches shared), for a drafter to
    /// advance along its own drafts.
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.clone(),
            vocab: self.vocab,
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

    /// How many of `tokens`, from the first, the grammar allows from here.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        if tokens.is_empty() || self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
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
