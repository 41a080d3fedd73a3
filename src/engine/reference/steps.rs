//! The steps both reference loops take alike: decoding in a fresh cache slot, emitting a token,
//! and ending the output for a reason outside the tokens.

use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::request::{
    check_request, FinishReason, GenerationRequest, OnOutput, OutputPiece,
};
use crate::model::KvCache;

/// Pushes one token through the emitter and shows it to the callback. Returns the finish
/// reason if the output ends here (the callback asking to stop included).
pub(super) fn emit_token(
    emitter: &mut Emitter,
    tok: u32,
    on_output: &mut OnOutput<'_>,
) -> Result<Option<FinishReason>, EngineError> {
    let finish = emitter.push(tok)?;
    let go_on = on_output(OutputPiece {
        token: Some(tok),
        text: emitter.delta(),
    });
    Ok(match finish {
        Some(f) => Some(f),
        None if !go_on => {
            emitter.end(FinishReason::Cancelled)?;
            Some(FinishReason::Cancelled)
        }
        None => None,
    })
}

/// Ends the output for a reason outside the tokens and hands the callback any text that was
/// still held back.
pub(super) fn end_output(
    emitter: &mut Emitter,
    reason: FinishReason,
    on_output: &mut OnOutput<'_>,
) -> Result<(), EngineError> {
    emitter.end(reason)?;
    if !emitter.delta().is_empty() {
        on_output(OutputPiece {
            token: None,
            text: emitter.delta(),
        });
    }
    Ok(())
}

/// Checks `req` against the cache, then runs `f` in a freshly allocated slot that is freed
/// afterwards, whatever `f` returns.
pub(super) fn in_fresh_slot<T>(
    cache: &mut KvCache,
    req: &GenerationRequest,
    f: impl FnOnce(&mut KvCache, usize) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    check_request(req, cache.max_len())?;
    let slot = cache.allocate().ok_or(EngineError::NoFreeSlot)?;
    let result = f(cache, slot);
    cache.free(slot)?;
    result
}
