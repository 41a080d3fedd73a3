//! A draft model's cache slots: which slot each sequence drafts in, rolling a slot back to
//! what the target kept (`keep_standing`), and the prefix cache's retained slots (kept, taken over, evicted,
//! dropped).
//!
//! Why it exists: the drafting loop (`model.rs`) reads a slot per sequence; where that slot
//! comes from and what it holds is the same ledger the target's CacheManager keeps, run here
//! on the drafter's own worker.

use std::ops::Deref;

use super::model_drafter::ModelDrafter;
use super::DraftError;
use crate::model::cache::prefix_index::{PrefixMatch, PrefixSource};
use crate::model::{Kept, Llama};
use crate::telemetry;

impl<M: Deref<Target = Llama>> ModelDrafter<M> {
    /// Forgets a sequence. Its slot is kept for its prefix when `keep` and the prefix cache
    /// are on (and the tokens it holds are known), and freed otherwise.
    pub fn end(&mut self, seq: u64, keep: bool) {
        if let Some(t) = &mut self.translator {
            t.forget(seq);
        }
        let held = self.held.remove(&seq);
        let Some(slot) = self.slots.remove(&seq) else {
            return;
        };
        match held {
            Some(tokens) if keep && self.prefix_cache => {
                for (s, _) in self.retained.retain(slot, tokens) {
                    let _ = self.cache.free(s);
                }
            }
            _ => {
                let _ = self.cache.free(slot);
            }
        }
        self.report_prefix_cache();
    }

    /// `standing` is what stands of `seq`'s context (all but its unverified last token): keeps
    /// the longest prefix of what the cache holds that agrees with it. After a tree round the
    /// accepted path may leave the drafted chain, so the cache's drafts are compared token by
    /// token, not just counted. A cache whose contents are not known starts over.
    pub fn keep_standing(&mut self, seq: u64, standing: &[u32]) -> Result<(), DraftError> {
        let standing = self.in_own_tokens(seq, standing)?.to_vec();
        let len = match self.held.get(&seq) {
            Some(held) => held
                .iter()
                .zip(&standing)
                .take_while(|(a, b)| a == b)
                .count(),
            None => 0,
        };
        self.keep_own(seq, len)
    }

    /// The first `len` tokens of `seq`'s context stand; forget anything past them.
    pub fn keep_seq(&mut self, seq: u64, len: usize) -> Result<(), DraftError> {
        let own = match &self.translator {
            Some(t) => t.draft_len(seq, len),
            None => len,
        };
        self.keep_own(seq, own)
    }

    /// The first `len` tokens the cache of `seq` holds (the drafter's own tokens) stand.
    fn keep_own(&mut self, seq: u64, len: usize) -> Result<(), DraftError> {
        if let Some(&slot) = self.slots.get(&seq) {
            if self.cache.len(slot)? > len {
                self.cache.keep(slot, Kept::First(len))?;
            }
            if let Some(h) = self.held.get_mut(&seq) {
                h.truncate(len);
            }
        }
        Ok(())
    }

    /// Forgets every retained prefix, freeing its slot.
    pub fn drop_retained(&mut self) -> Result<(), DraftError> {
        while let Some((slot, _)) = self.retained.evict(None) {
            self.cache.free(slot)?;
        }
        self.report_prefix_cache();
        Ok(())
    }

    fn report_prefix_cache(&self) {
        if self.prefix_cache {
            telemetry::set_prefix_cache("draft", self.retained.len(), self.retained.tokens());
        }
    }

    /// A free slot, evicting the least recently used retained one other than `keep` if there
    /// is none.
    fn free_slot(&mut self, keep: Option<usize>) -> Result<usize, DraftError> {
        loop {
            if let Some(slot) = self.cache.allocate() {
                return Ok(slot);
            }
            let Some((slot, _)) = self.retained.evict(keep) else {
                return Err(DraftError::Model(crate::model::ModelError::BadInput(
                    format!(
                        "the draft cache has no free slot ({} in use)",
                        self.slots.len()
                    ),
                )));
            };
            self.cache.free(slot)?;
            telemetry::record_prefix_eviction("draft");
        }
    }

    /// The slot `seq` drafts in; a new sequence starts from the longest prefix of its
    /// `context` (all but its last token) that a retained slot (taken over) or a running
    /// sequence's (copied) holds.
    pub(super) fn slot_for(&mut self, seq: u64, context: &[u32]) -> Result<usize, DraftError> {
        if let Some(&slot) = self.slots.get(&seq) {
            return Ok(slot);
        }
        let limit = context.len().saturating_sub(1);
        let found = if self.prefix_cache {
            let running = self
                .held
                .iter()
                .filter_map(|(s, t)| Some((*self.slots.get(s)?, t.as_slice())));
            self.retained.best_match(context, limit, running)
        } else {
            None
        };
        // As the target's ledger does: a retained cache whose whole text the context extends
        // is taken over; one matched in part is copied from and kept while a slot is free.
        let (slot, len) = match found {
            Some(PrefixMatch {
                source: PrefixSource::Retained { slot },
                len,
            }) => {
                let whole = self.retained.slots().any(|(s, n)| s == slot && n == len);
                let fresh = if whole {
                    None
                } else {
                    self.free_slot(Some(slot)).ok()
                };
                match fresh {
                    Some(fresh) => {
                        self.retained.touch(slot);
                        self.cache.copy_prefix(slot, fresh, len)?;
                        (fresh, len)
                    }
                    None => {
                        self.retained.take(slot);
                        self.cache.keep(slot, Kept::First(len))?;
                        (slot, len)
                    }
                }
            }
            Some(PrefixMatch {
                source: PrefixSource::Running { slot: from },
                len,
            }) => {
                let slot = self.free_slot(None)?;
                self.cache.copy_prefix(from, slot, len)?;
                (slot, len)
            }
            None => (self.free_slot(None)?, 0),
        };
        if self.prefix_cache {
            telemetry::record_prefix_lookup("draft", context.len(), len);
            self.report_prefix_cache();
        }
        self.slots.insert(seq, slot);
        self.held.insert(seq, context[..len].to_vec());
        Ok(slot)
    }
}
