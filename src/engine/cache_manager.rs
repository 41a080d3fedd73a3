//! The CacheManager actor: the ledger of target KV slots and KV capacity.
//!
//! Why it exists: admission needs one answer to "is there room for this sequence?" that counts
//! every active sequence, whichever actor is touching its cache at the moment. The caches
//! themselves live on the compute workers; this ledger decides which slot a sequence gets and
//! how many tokens it may grow to, and takes both back when the sequence ends.

use kameo::message::{Context, Message};
use kameo::Actor;

use super::messages::{CacheStats, GetCacheStats, Release, Reserve};

#[derive(Actor)]
pub struct CacheManager {
    free: Vec<usize>,
    total_slots: usize,
    capacity_tokens: usize,
    reserved_tokens: usize,
    /// Whether a draft model keeps caches of its own (prompt lookup has none).
    draft_cache: bool,
}

impl CacheManager {
    pub fn new(slots: usize, capacity_tokens: usize, draft_cache: bool) -> Self {
        let manager = Self {
            free: (0..slots).rev().collect(),
            total_slots: slots,
            capacity_tokens,
            reserved_tokens: 0,
            draft_cache,
        };
        manager.report_usage();
        manager
    }
}

impl CacheManager {
    /// Reservations cover the draft model's per-sequence caches too (they hold the same
    /// tokens), so one ratio describes both.
    fn report_usage(&self) {
        let ratio = self.reserved_tokens as f64 / self.capacity_tokens.max(1) as f64;
        crate::telemetry::set_kv_usage("target", ratio);
        if self.draft_cache {
            crate::telemetry::set_kv_usage("draft", ratio);
        }
    }
}

impl Message<Reserve> for CacheManager {
    type Reply = Option<usize>;

    async fn handle(&mut self, msg: Reserve, _: &mut Context<Self, Self::Reply>) -> Option<usize> {
        if self.reserved_tokens + msg.tokens > self.capacity_tokens {
            return None;
        }
        let slot = self.free.pop()?;
        self.reserved_tokens += msg.tokens;
        self.report_usage();
        Some(slot)
    }
}

impl Message<Release> for CacheManager {
    type Reply = ();

    async fn handle(&mut self, msg: Release, _: &mut Context<Self, Self::Reply>) {
        debug_assert!(!self.free.contains(&msg.slot), "slot released twice");
        if !self.free.contains(&msg.slot) && msg.slot < self.total_slots {
            self.free.push(msg.slot);
            self.reserved_tokens = self.reserved_tokens.saturating_sub(msg.tokens);
        }
        self.report_usage();
    }
}

impl Message<GetCacheStats> for CacheManager {
    type Reply = CacheStats;

    async fn handle(&mut self, _: GetCacheStats, _: &mut Context<Self, Self::Reply>) -> CacheStats {
        CacheStats {
            total_slots: self.total_slots,
            free_slots: self.free.len(),
            capacity_tokens: self.capacity_tokens,
            reserved_tokens: self.reserved_tokens,
        }
    }
}
