//! How long one sequence may grow and how many tokens all sequences' KV caches may hold
//! together, from what a token costs in the caches and the memory left after loading.
//!
//! Why it exists: a model's own context (SmolLM2: 8192, Gemma 3: 32768) is the context a user
//! expects, but a server of 8 sequences each allowed 32768 tokens may need more memory for its
//! caches than the machine has; the caches grow as sequences do, so nothing fails at start-up
//! and the process dies later, under load. Admission already reserves each sequence's tokens
//! against a total: that total is set here to what memory holds, so a server too small for
//! every slot at full length queues requests instead, and a context no sequence could reach
//! is lowered (the model's own, by default) or refused (one the configuration asked for).

use super::error::EngineError;
use crate::draft::LoadedDrafter;
use crate::model::Decoder;

/// The share of the memory available after loading that the KV caches may take: the rest is
/// for activations, the prefix cache's copies in flight, the server and the machine.
const KV_SHARE: f64 = 0.8;
/// A lowered context is a multiple of this.
const CONTEXT_STEP: usize = 256;

/// One sequence's most tokens, and the tokens all sequences together may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRoom {
    pub context_len: usize,
    pub capacity_tokens: usize,
}

/// What the caches need and what there is.
#[derive(Clone, Copy, Debug)]
pub struct KvNeeds {
    /// Bytes one token takes in every cache that holds it (the target's and a draft model's).
    pub bytes_per_token: usize,
    pub context_len: usize,
    /// The context is the model's own maximum, not one the configuration asked for: it may be
    /// lowered to fit.
    pub from_model: bool,
    pub max_seqs: usize,
    /// Bytes of memory available now (after loading), less what the prefix cache may hold;
    /// `None` when not known (or the caches live on a device): nothing is capped.
    pub available: Option<usize>,
}

/// The room the caches get (see the module's doc). Errs, naming `model.context_length`, when
/// a configured context does not fit one sequence.
pub fn plan_kv_room(n: KvNeeds) -> Result<KvRoom, EngineError> {
    let every_slot = n.max_seqs.max(1) * n.context_len;
    let Some(available) = n.available else {
        return Ok(KvRoom {
            context_len: n.context_len,
            capacity_tokens: every_slot,
        });
    };
    let fits = (available as f64 * KV_SHARE) as usize / n.bytes_per_token.max(1);
    if fits >= n.context_len {
        return Ok(KvRoom {
            context_len: n.context_len,
            capacity_tokens: every_slot.min(fits),
        });
    }
    let gb = |tokens: usize| (tokens * n.bytes_per_token) as f64 / 1e9;
    let lowered = fits / CONTEXT_STEP * CONTEXT_STEP;
    if !n.from_model || lowered < CONTEXT_STEP {
        return Err(EngineError::ContextTooLong {
            context: n.context_len,
            need_gb: gb(n.context_len),
            available_gb: available as f64 / 1e9,
            fits: lowered,
        });
    }
    Ok(KvRoom {
        context_len: lowered,
        capacity_tokens: fits,
    })
}

/// How long a sequence may grow and how many tokens the caches may hold together for these
/// models (`max_seqs` sequences, the context the model's own when `from_model`), logged: the
/// memory a token takes and what the caches may reach.
pub(super) fn room_for(
    (target, draft): (&Decoder, Option<&LoadedDrafter>),
    (max_seqs, from_model): (usize, bool),
    prefix_bytes: usize,
) -> Result<KvRoom, EngineError> {
    let cache = target.new_cache(0);
    let target_bpt = cache.bytes_per_token();
    let draft_bpt = match draft {
        Some(LoadedDrafter::Model { model, .. }) => model.new_cache(0).bytes_per_token(),
        _ => 0,
    };
    let available = (!cache.is_on_device())
        .then(crate::model::load::host_memory::available)
        .flatten()
        .map(|a| a.saturating_sub(prefix_bytes));
    let room = plan_kv_room(KvNeeds {
        bytes_per_token: target_bpt + draft_bpt,
        context_len: target.context_len(),
        from_model,
        max_seqs,
        available,
    })?;
    if room.context_len < target.context_len() {
        tracing::warn!(
            model_max = target.context_len(),
            context = room.context_len,
            "the model's own context does not fit one sequence's KV cache in memory: lowered"
        );
    }
    tracing::info!(
        context = room.context_len,
        target_kv_bytes_per_token = target_bpt,
        draft_kv_bytes_per_token = draft_bpt,
        capacity_tokens = room.capacity_tokens,
        capacity_gb = (room.capacity_tokens * (target_bpt + draft_bpt)) as f64 / 1e9,
        "KV caches"
    );
    Ok(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KB: usize = 1000;

    fn needs(context_len: usize, from_model: bool, available: Option<usize>) -> KvNeeds {
        KvNeeds {
            bytes_per_token: 20 * KB,
            context_len,
            from_model,
            max_seqs: 8,
            available,
        }
    }

    #[test]
    fn plenty_of_memory_gives_every_slot_its_whole_context() {
        let room = plan_kv_room(needs(8192, true, Some(100_000_000 * KB))).unwrap();
        assert_eq!(
            room,
            KvRoom {
                context_len: 8192,
                capacity_tokens: 8 * 8192
            }
        );
        // Not known: nothing capped.
        let room = plan_kv_room(needs(32768, true, None)).unwrap();
        assert_eq!(room.capacity_tokens, 8 * 32768);
    }

    #[test]
    fn memory_for_some_full_sequences_caps_the_total_not_the_context() {
        // 1 GB: 0.8 GB / 20 KB = 40,000 tokens, more than one 32k sequence, fewer than 8.
        let room = plan_kv_room(needs(32768, false, Some(1_000_000 * KB))).unwrap();
        assert_eq!(room.context_len, 32768);
        assert_eq!(room.capacity_tokens, 40_000);
    }

    #[test]
    fn the_models_own_context_is_lowered_to_what_fits_and_a_configured_one_refused() {
        // 0.5 GB: 20,000 tokens, not one 32k sequence.
        let room = plan_kv_room(needs(32768, true, Some(500_000 * KB))).unwrap();
        assert_eq!(room.context_len, 19968);
        assert_eq!(room.capacity_tokens, 20_000);
        let e = plan_kv_room(needs(32768, false, Some(500_000 * KB))).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("model.context_length"), "{text}");
        assert!(text.contains("32768") && text.contains("19968"), "{text}");
        // Too little for even a short context: refused either way.
        assert!(plan_kv_room(needs(8192, true, Some(5_000 * KB))).is_err());
    }
}
