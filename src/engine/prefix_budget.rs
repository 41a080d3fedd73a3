//! How many bytes the prefix cache may hold, and how they are shared between the target's store
//! and a draft model's.
//!
//! Why it exists: the cache is sized by memory, not by a count of conversations, and a server
//! should have a sensible size without being told: llama.cpp's server keeps up to 8 GiB of
//! cached prompts in host memory by default; tandem keeps at most that and never more than an
//! eighth of the memory the process may use, so a small machine or container keeps its memory
//! for weights and running sequences. A device cache (the tensor backend) competes with the
//! weights for the accelerator's memory, so it defaults to 1 GiB.

use crate::draft::LoadedDrafter;
use crate::model::Decoder;

const MIB: usize = 1 << 20;
const HOST_MAX: usize = 8 << 30;
const DEVICE_DEFAULT: usize = 1 << 30;

/// The budget in bytes: `mib` when set (`engine.prefix_cache_mib`), else the default for where
/// the cache lives.
pub fn prefix_budget_bytes(mib: Option<usize>, on_device: bool) -> usize {
    match mib {
        Some(mib) => mib.saturating_mul(MIB),
        None if on_device => DEVICE_DEFAULT,
        None => host_default(crate::model::load::host_memory::total()),
    }
}

/// At most 8 GiB and an eighth of `limit` (the memory the process may use, when known).
fn host_default(limit: Option<usize>) -> usize {
    limit.map_or(HOST_MAX, |l| (l / 8).min(HOST_MAX))
}

/// Splits `budget` between the target's store and a draft model's in proportion to their bytes
/// per token, so both hold the same number of tokens (the draft model caches the same texts):
/// `(target, draft)`.
pub fn split_budget(budget: usize, target_bpt: usize, draft_bpt: Option<usize>) -> (usize, usize) {
    match draft_bpt {
        Some(d) if d > 0 => {
            let total = (target_bpt + d) as u128;
            let target = (budget as u128 * target_bpt as u128 / total) as usize;
            (target, budget - target)
        }
        _ => (budget, 0),
    }
}

/// The bytes the target's prefix cache and a draft model's may hold (0 with the cache off,
/// `on` false): `mib` or the default ([`prefix_budget_bytes`]), split by [`split_budget`].
pub fn prefix_budgets(
    (on, mib): (bool, Option<usize>),
    target: &Decoder,
    draft: Option<&LoadedDrafter>,
) -> (usize, usize) {
    if !on {
        return (0, 0);
    }
    let cache = target.new_cache(0);
    let budget = prefix_budget_bytes(mib, cache.is_on_device());
    let draft_bpt = match draft {
        Some(LoadedDrafter::Model { model, .. }) => Some(model.new_cache(0).bytes_per_token()),
        _ => None,
    };
    split_budget(budget, cache.bytes_per_token(), draft_bpt)
}

/// The prefix caches' series exist from start-up: the target's, and a draft model's.
pub fn register_prefix_caches(on: bool, draft_cache: bool, (target, draft): (usize, usize)) {
    if on {
        crate::telemetry::register_prefix_cache("target", target);
        if draft_cache {
            crate::telemetry::register_prefix_cache("draft", draft);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_budget_wins_and_the_default_fits_the_machine() {
        assert_eq!(prefix_budget_bytes(Some(3), false), 3 * MIB);
        assert_eq!(prefix_budget_bytes(Some(0), true), 0);
        assert_eq!(prefix_budget_bytes(None, true), DEVICE_DEFAULT);
        assert_eq!(host_default(Some(16 << 30)), 2 << 30);
        assert_eq!(host_default(Some(512 << 30)), HOST_MAX);
        assert_eq!(host_default(None), HOST_MAX);
        let auto = prefix_budget_bytes(None, false);
        assert!(auto > 0 && auto <= HOST_MAX, "{auto}");
    }

    #[test]
    fn the_models_share_the_budget_by_bytes_per_token() {
        assert_eq!(split_budget(1000, 30, Some(10)), (750, 250));
        assert_eq!(split_budget(1000, 30, None), (1000, 0));
        let (t, d) = split_budget(usize::MAX, 7, Some(3));
        assert_eq!(t.checked_add(d), Some(usize::MAX));
    }
}
