//! A draft model's cache slots: which slot each sequence drafts in, rolling a slot back to
//! what the target kept (`keep_standing`), and the draft model's prefix cache (a new slot
//! started from it, an ended sequence stored in it).
//!
//! Why it exists: the drafting loop (`model_drafter.rs`) reads a slot per sequence; where that
//! slot comes from and what it holds is what the target's scheduler and verifier do for the
//! target, run here on the drafter's own worker.

use std::ops::Deref;

use super::model_drafter::ModelDrafter;
use super::DraftError;
use crate::model::cache::prefix_store::common_prefix;
use crate::model::{Decoder, Kept};
use crate::telemetry;

impl<M: Deref<Target = Decoder>> ModelDrafter<M> {
    /// Forgets a sequence. What its slot holds is stored in the prefix cache when `keep` and
    /// the prefix cache are on (and the tokens it holds are known); the slot is freed.
    pub fn end(&mut self, seq: u64, keep: bool) {
        if let Some(t) = &mut self.translator {
            t.forget(seq);
        }
        let held = self.held.remove(&seq);
        let scope = self.scopes.remove(&seq).unwrap_or(0);
        let Some(slot) = self.slots.remove(&seq) else {
            return;
        };
        if let (Some(store), Some(tokens), true) = (&mut self.prefix, held, keep) {
            // A store that failed keeps what it held before; the slot goes either way.
            let _ = store.insert(&self.cache, slot, scope, &tokens);
        }
        let _ = self.cache.free(slot);
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

    /// Forgets everything the prefix cache holds.
    pub fn clear_prefix_cache(&mut self) -> Result<(), DraftError> {
        if let Some(store) = &mut self.prefix {
            store.clear();
        }
        self.report_prefix_cache();
        Ok(())
    }

    fn report_prefix_cache(&mut self) {
        if let Some(store) = &mut self.prefix {
            let s = store.stats();
            telemetry::set_prefix_cache("draft", s.runs, s.tokens, s.bytes, s.budget_bytes);
            telemetry::record_prefix_evictions("draft", store.take_evictions());
        }
    }

    /// The slot `seq` drafts in; a new sequence starts from the longest prefix of its
    /// `context` (all but its last token) that the prefix cache holds in its `scope` or a
    /// running sequence's slot of that scope holds (copied).
    pub(super) fn slot_for(
        &mut self,
        seq: u64,
        scope: u64,
        context: &[u32],
    ) -> Result<usize, DraftError> {
        if let Some(&slot) = self.slots.get(&seq) {
            return Ok(slot);
        }
        let slot = self.cache.allocate().ok_or_else(|| {
            DraftError::Model(crate::model::ModelError::BadInput(format!(
                "the draft cache has no free slot ({} in use)",
                self.slots.len()
            )))
        })?;
        let len = match self.start_from_prefix(slot, scope, context) {
            Ok(len) => len,
            Err(e) => {
                let _ = self.cache.free(slot);
                return Err(e);
            }
        };
        self.slots.insert(seq, slot);
        self.scopes.insert(seq, scope);
        self.held.insert(seq, context[..len].to_vec());
        Ok(slot)
    }

    /// Copies into `slot` the longer of what the store and a running sequence's slot hold of
    /// `context`'s start (all but its last token) in `scope`; how many tokens.
    fn start_from_prefix(
        &mut self,
        slot: usize,
        scope: u64,
        context: &[u32],
    ) -> Result<usize, DraftError> {
        let Some(store) = &mut self.prefix else {
            return Ok(0);
        };
        let limit = context.len().saturating_sub(1);
        let running = self
            .held
            .iter()
            .filter(|(s, _)| self.scopes.get(s) == Some(&scope))
            .filter_map(|(s, t)| Some((*self.slots.get(s)?, common_prefix(t, context))))
            .max_by_key(|&(_, n)| n);
        let len = store.start(&mut self.cache, slot, scope, (context, limit), running)?;
        telemetry::record_prefix_lookup("draft", context.len(), len);
        self.report_prefix_cache();
        Ok(len)
    }
}
