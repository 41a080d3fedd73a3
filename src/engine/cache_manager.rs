//! The CacheManager actor: the ledger of target KV slots and KV capacity, and the prefix cache's
//! index of retained slots.
//!
//! Why it exists: admission needs one answer to "is there room for this sequence, and where
//! does its prompt start?" that counts every active sequence and every retained slot,
//! whichever actor is touching a cache at the moment. The caches themselves live on the compute
//! workers; this ledger decides which slot a sequence gets, how many tokens it may grow to,
//! which finished sequence's slot is kept for its prefix, and which kept slot is evicted (the
//! least recently used) when a new sequence needs the room.

use kameo::message::{Context, Message};
use kameo::Actor;

use super::messages::{
    Admission, Admit, CacheStats, DropRetained, GetCacheStats, PrefixStart, Release, Retain,
};
use crate::model::cache::prefix_index::{PrefixIndex, PrefixMatch, PrefixSource};
use crate::telemetry;

#[derive(Actor)]
pub struct CacheManager {
    free: Vec<usize>,
    total_slots: usize,
    capacity_tokens: usize,
    /// Running sequences' reservations plus the tokens retained slots hold.
    reserved_tokens: usize,
    retained: PrefixIndex,
    /// Whether a draft model keeps caches of its own (prompt lookup has none).
    draft_cache: bool,
    /// Prompt tokens looked up in the prefix cache since start, and those it held.
    queried_tokens: u64,
    hit_tokens: u64,
}

impl CacheManager {
    pub fn new(slots: usize, capacity_tokens: usize, draft_cache: bool) -> Self {
        let manager = Self {
            free: (0..slots).rev().collect(),
            total_slots: slots,
            capacity_tokens,
            reserved_tokens: 0,
            retained: PrefixIndex::default(),
            draft_cache,
            queried_tokens: 0,
            hit_tokens: 0,
        };
        manager.report_usage();
        manager
    }

    /// Reservations cover the draft model's per-sequence caches too (they hold the same
    /// tokens), so one ratio describes both. Retained slots are not in it: they give way to
    /// any new sequence (their own gauges show them).
    fn report_usage(&self) {
        let running = self.reserved_tokens.saturating_sub(self.retained.tokens());
        let ratio = running as f64 / self.capacity_tokens.max(1) as f64;
        telemetry::set_kv_usage("target", ratio);
        if self.draft_cache {
            telemetry::set_kv_usage("draft", ratio);
        }
        telemetry::set_prefix_cache("target", self.retained.len(), self.retained.tokens());
    }

    /// Frees a retained slot; its tokens leave the reservations.
    fn drop_retained(&mut self, slot: usize, tokens: usize) {
        self.free.push(slot);
        self.reserved_tokens = self.reserved_tokens.saturating_sub(tokens);
    }

    fn admit(&mut self, msg: &Admit) -> Admission {
        let mut out = Admission::default();
        let limit = msg.prompt.len().saturating_sub(1);
        let found = if msg.prefix_cache {
            let retained = self.retained.best_match(&msg.prompt, limit, []);
            let running = msg.running.map(|(slot, len)| PrefixMatch {
                source: PrefixSource::Running { slot },
                len: len.min(limit),
            });
            [retained, running]
                .into_iter()
                .flatten()
                .filter(|m| m.len > 0)
                .max_by_key(|m| (m.len, matches!(m.source, PrefixSource::Retained { .. })))
        } else {
            None
        };
        // A retained slot whose whole text the prompt extends is taken over (its entry would
        // be superseded by this sequence's anyway); one matched only in part is copied from and
        // kept, unless there is no room for a fresh slot beside it.
        let (source, len) = match found {
            Some(m) => match m.source {
                PrefixSource::Retained { slot } | PrefixSource::Running { slot } => {
                    (Some(slot), m.len)
                }
            },
            None => (None, 0),
        };
        let held = |m: &Self, slot| m.retained.slots().find(|&(s, _)| s == slot).map(|(_, n)| n);
        let source_held = source.and_then(|s| held(self, s));
        let take_over = match source_held {
            Some(n) if n == len => true,
            Some(_) => !self.make_room(msg, source, 0, 0, &mut out),
            None => false,
        };
        let adopted = take_over.then_some(source).flatten();
        let adopted_tokens = if take_over {
            source_held.unwrap_or(0)
        } else {
            0
        };
        if !self.make_room(
            msg,
            adopted.or(source),
            adopted_tokens,
            usize::from(take_over),
            &mut out,
        ) {
            return out;
        }
        if let Some(slot) = adopted {
            self.retained.take(slot);
            self.reserved_tokens = self.reserved_tokens.saturating_sub(adopted_tokens);
            out.slots.push(slot);
        } else if let Some(slot) = source.filter(|_| source_held.is_some()) {
            self.retained.touch(slot);
        }
        while out.slots.len() < msg.choices {
            out.slots.push(self.free.pop().expect("room made above"));
        }
        self.reserved_tokens += msg.tokens * msg.choices;
        out.prefix = source.map(|slot| {
            let start = if take_over {
                PrefixStart::TakeOver
            } else {
                PrefixStart::CopyFrom(slot)
            };
            (start, len)
        });
        out
    }

    /// Evicts retained slots other than `keep`, least recently used first, until `msg` fits:
    /// `adopted` of its slots come from a retained slot holding `adopted_tokens`. Whether it
    /// fits.
    fn make_room(
        &mut self,
        msg: &Admit,
        keep: Option<usize>,
        adopted_tokens: usize,
        adopted: usize,
        out: &mut Admission,
    ) -> bool {
        let fits = |m: &Self| {
            m.free.len() + adopted >= msg.choices
                && m.reserved_tokens.saturating_sub(adopted_tokens) + msg.tokens * msg.choices
                    <= m.capacity_tokens
        };
        while !fits(self) {
            let Some((slot, tokens)) = self.retained.evict(keep) else {
                return false;
            };
            self.drop_retained(slot, tokens);
            out.evicted.push(slot);
            telemetry::record_prefix_eviction("target");
        }
        true
    }
}

impl Message<Admit> for CacheManager {
    type Reply = Admission;

    async fn handle(&mut self, msg: Admit, _: &mut Context<Self, Self::Reply>) -> Admission {
        let out = self.admit(&msg);
        if msg.prefix_cache && !out.slots.is_empty() {
            let hit = out.prefix.map_or(0, |(_, len)| len);
            self.queried_tokens += msg.prompt.len() as u64;
            self.hit_tokens += hit as u64;
            telemetry::record_prefix_lookup("target", msg.prompt.len(), hit);
        }
        self.report_usage();
        out
    }
}

impl Message<Retain> for CacheManager {
    type Reply = Vec<usize>;

    async fn handle(&mut self, msg: Retain, _: &mut Context<Self, Self::Reply>) -> Vec<usize> {
        // The reservation shrinks to what the cache holds; whatever the index does not keep
        // leaves it.
        self.reserved_tokens = self.reserved_tokens.saturating_sub(msg.reserved) + msg.tokens.len();
        let mut dropped = Vec::new();
        for (slot, tokens) in self.retained.retain(msg.slot, msg.tokens) {
            self.drop_retained(slot, tokens);
            dropped.push(slot);
        }
        self.report_usage();
        dropped
    }
}

impl Message<DropRetained> for CacheManager {
    type Reply = Vec<usize>;

    async fn handle(&mut self, _: DropRetained, _: &mut Context<Self, Self::Reply>) -> Vec<usize> {
        let mut dropped = Vec::new();
        while let Some((slot, tokens)) = self.retained.evict(None) {
            self.drop_retained(slot, tokens);
            dropped.push(slot);
        }
        self.report_usage();
        dropped
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
            retained_slots: self.retained.len(),
            retained_tokens: self.retained.tokens(),
            prefix_queried_tokens: self.queried_tokens,
            prefix_hit_tokens: self.hit_tokens,
        }
    }
}
