//! The check that a drafter's tokens mean what the target's do.
//!
//! Why it exists: speculative decoding compares draft and target distributions token id by
//! token id, so a drafter with another vocabulary would be silently wrong, not just slow.
//! Start-up refuses it with both models named.

use super::DraftError;
use crate::model::TextTokenizer;

/// Refuses a drafter whose tokens mean something else than the target's: same vocabulary size
/// and the same string for every token id.
pub fn check_same_vocabulary(
    draft: &TextTokenizer,
    draft_name: &str,
    target: &TextTokenizer,
    target_name: &str,
) -> Result<(), DraftError> {
    let mismatch = |reason: String| DraftError::VocabMismatch {
        draft: draft_name.to_owned(),
        target: target_name.to_owned(),
        reason,
    };
    if draft.vocab_size() != target.vocab_size() {
        return Err(mismatch(format!(
            "{} vs {} tokens",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    for id in 0..target.vocab_size() as u32 {
        if draft.id_to_token(id) != target.id_to_token(id) {
            return Err(mismatch(format!(
                "token {id} is {:?} in the draft and {:?} in the target",
                draft.id_to_token(id),
                target.id_to_token(id)
            )));
        }
    }
    Ok(())
}
