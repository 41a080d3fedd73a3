//! The CacheManager actor: the ledger of target KV slots and KV capacity, and the prefix cache's
//! counts.
//!
//! Why it exists: admission needs one answer to "is there room for this sequence?" that counts
//! every active sequence, whichever actor is touching a cache at the moment. The caches
//! themselves live on the compute workers, and so does the prefix cache (beside the cache it
//! copies into); this ledger decides which slot a sequence gets and how many tokens it may
//! grow to, and keeps what routers and `/v1/loads` read of the prefix cache.

use kameo::message::{Context, Message};
use kameo::Actor;

use super::messages::{Admission, Admit, CacheStats, GetCacheStats, PrefixReport, Release};
use crate::model::cache::prefix_store::PrefixStoreStats;
use crate::telemetry;

#[derive(Actor)]
pub struct CacheManager {
    free: Vec<usize>,
    total_slots: usize,
    capacity_tokens: usize,
    /// Running sequences' reservations.
    reserved_tokens: usize,
    /// Whether a draft model keeps caches of its own (prompt lookup has none).
    draft_cache: bool,
    /// Prompt tokens looked up in the prefix cache since start, and those it held.
    queried_tokens: u64,
    hit_tokens: u64,
    /// What the target's prefix cache held at its last report.
    store: PrefixStoreStats,
}

impl CacheManager {
    pub fn new(slots: usize, capacity_tokens: usize, draft_cache: bool) -> Self {
        let manager = Self {
            free: (0..slots).rev().collect(),
            total_slots: slots,
            capacity_tokens,
            reserved_tokens: 0,
            draft_cache,
            queried_tokens: 0,
            hit_tokens: 0,
            store: PrefixStoreStats::default(),
        };
        manager.report_usage();
        manager
    }

    /// Reservations cover the draft model's per-sequence caches too (they hold the same
    /// tokens), so one ratio describes both.
    fn report_usage(&self) {
        let ratio = self.reserved_tokens as f64 / self.capacity_tokens.max(1) as f64;
        telemetry::set_kv_usage("target", ratio);
        if self.draft_cache {
            telemetry::set_kv_usage("draft", ratio);
        }
    }

    fn admit(&mut self, msg: &Admit) -> Admission {
        let fits = self.free.len() >= msg.choices
            && self.reserved_tokens + msg.tokens * msg.choices <= self.capacity_tokens;
        if !fits {
            return Admission::default();
        }
        self.reserved_tokens += msg.tokens * msg.choices;
        Admission {
            slots: (0..msg.choices)
                .map(|_| self.free.pop().expect("counted above"))
                .collect(),
        }
    }
}

impl Message<Admit> for CacheManager {
    type Reply = Admission;

    async fn handle(&mut self, msg: Admit, _: &mut Context<Self, Self::Reply>) -> Admission {
        let out = self.admit(&msg);
        self.report_usage();
        out
    }
}

impl Message<PrefixReport> for CacheManager {
    type Reply = ();

    async fn handle(&mut self, msg: PrefixReport, _: &mut Context<Self, Self::Reply>) {
        self.queried_tokens += msg.queried as u64;
        self.hit_tokens += msg.hit as u64;
        self.store = msg.store;
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
            prefix_tokens: self.store.tokens,
            prefix_bytes: self.store.bytes,
            prefix_budget_bytes: self.store.budget_bytes,
            prefix_queried_tokens: self.queried_tokens,
            prefix_hit_tokens: self.hit_tokens,
        }
    }
}
