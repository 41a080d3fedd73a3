//! Stored responses (`store: true`, the Responses API's default): what `GET /v1/responses/{id}`
//! returns and what `previous_response_id` continues from, in memory, bounded in count, in
//! bytes and in age (`server.responses_stored`, `server.responses_stored_bytes`,
//! `server.responses_ttl_seconds`), per replica, each visible only to its [`Tenant`].
//!
//! Why it exists: a conversation continued by id must find its earlier turns, no other client
//! may find them, and a server must not grow without bound keeping them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::api_keys::Tenant;

/// One stored response.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The response object, as returned.
    pub response: Value,
    /// The whole conversation up to and with its answer, as chat messages (instructions
    /// excepted: they do not carry over).
    pub conversation: Vec<Value>,
}

/// A stored response as kept: its JSON text (what it costs is what is counted, not a
/// `Value`'s tree, which may take ten times its text), and whose it is.
struct Entry {
    at: Instant,
    tenant: Tenant,
    response: String,
    conversation: String,
}

impl Entry {
    fn bytes(&self, id: &str) -> usize {
        // The id twice (map and order) and the bookkeeping beside the text.
        self.response.len() + self.conversation.len() + 2 * id.len() + 128
    }
}

/// How many responses the store keeps, for how long, and in how many bytes together.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    pub count: usize,
    pub ttl: Duration,
    pub bytes: usize,
}

pub struct ResponseStore {
    limits: StoreLimits,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Ids, oldest first (an id removed early stays here until it reaches the front, or the
    /// next compaction).
    order: VecDeque<(Instant, String)>,
    /// What `by_id` holds, in [`Entry::bytes`], in all and per tenant.
    bytes: usize,
    by_tenant: HashMap<Tenant, usize>,
    /// Responses still being generated that will be stored, and whose they are: a `DELETE`
    /// of one removes it here, and it is then never stored.
    pending: HashMap<String, Tenant>,
}

impl Inner {
    /// Forgets what is past its age, then, while the store is over its count or bytes, the
    /// oldest response of the tenant holding the most bytes: a client that stores a flood
    /// pushes out its own responses, not another's.
    fn evict(&mut self, limits: StoreLimits, now: Instant) {
        while let Some((at, id)) = self.order.front() {
            let stale = now.duration_since(*at) >= limits.ttl;
            let gone = self.by_id.get(id).is_none_or(|e| e.at != *at);
            if !(stale || gone) {
                break;
            }
            if !gone {
                self.remove(&id.clone());
            }
            self.order.pop_front();
        }
        while self.by_id.len() > limits.count || self.bytes > limits.bytes {
            let Some(heaviest) = self
                .by_tenant
                .iter()
                .max_by_key(|(_, b)| **b)
                .map(|(t, _)| *t)
            else {
                break;
            };
            let oldest = self.order.iter().find_map(|(at, id)| {
                self.by_id
                    .get(id)
                    .filter(|e| e.at == *at && e.tenant == heaviest)
                    .map(|_| id.clone())
            });
            match oldest {
                Some(id) => {
                    self.remove(&id);
                }
                None => break,
            }
        }
        // Ids removed out of order stay in `order` until they reach its front: compacted once
        // they outnumber the live ones, so a flood cannot grow it.
        if self.order.len() > 2 * self.by_id.len() + 64 {
            let by_id = &self.by_id;
            self.order
                .retain(|(at, id)| by_id.get(id).is_some_and(|e| e.at == *at));
        }
    }

    fn insert(&mut self, id: &str, entry: Entry) {
        self.remove(id);
        let bytes = entry.bytes(id);
        self.bytes += bytes;
        *self.by_tenant.entry(entry.tenant).or_default() += bytes;
        self.order.push_back((entry.at, id.to_string()));
        self.by_id.insert(id.to_string(), entry);
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(e) = self.by_id.remove(id) else {
            return false;
        };
        let bytes = e.bytes(id);
        self.bytes -= bytes;
        if let Some(held) = self.by_tenant.get_mut(&e.tenant) {
            *held -= bytes;
            if *held == 0 {
                self.by_tenant.remove(&e.tenant);
            }
        }
        true
    }
}

impl ResponseStore {
    /// Keeps at most `limits.count` responses (0: none) in `limits.bytes`, each for
    /// `limits.ttl`.
    pub fn new(limits: StoreLimits) -> Self {
        Self {
            limits,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn is_on(&self) -> bool {
        self.limits.count > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the maps consistent (every change
        // is one insert or remove), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `id` as a response of `tenant` that will be stored when it is done.
    pub fn reserve(&self, id: &str, tenant: Tenant) {
        if self.is_on() {
            self.lock().pending.insert(id.to_string(), tenant);
        }
    }

    /// Forgets a reservation whose response will not be stored (it failed).
    pub fn release(&self, id: &str) {
        self.lock().pending.remove(id);
    }

    /// Stores a reserved response; whether it was (not if it was deleted while in flight).
    pub fn put(&self, id: &str, stored: Stored) -> bool {
        self.put_at(id, stored, Instant::now())
    }

    fn put_at(&self, id: &str, stored: Stored, now: Instant) -> bool {
        let mut inner = self.lock();
        let Some(tenant) = inner.pending.remove(id) else {
            return false;
        };
        let entry = Entry {
            at: now,
            tenant,
            response: stored.response.to_string(),
            conversation: Value::from(stored.conversation).to_string(),
        };
        if entry.bytes(id) > self.limits.bytes {
            tracing::warn!(
                bytes = entry.bytes(id),
                "a response larger than server.responses_stored_bytes was not stored"
            );
            return false;
        }
        inner.insert(id, entry);
        inner.evict(self.limits, now);
        true
    }

    /// The response `id` if `tenant` stored it (another tenant's is as unknown as no
    /// response at all).
    pub fn get(&self, id: &str, tenant: Tenant) -> Option<Stored> {
        self.get_at(id, tenant, Instant::now())
    }

    fn get_at(&self, id: &str, tenant: Tenant, now: Instant) -> Option<Stored> {
        let (response, conversation) = {
            let mut inner = self.lock();
            inner.evict(self.limits, now);
            let e = inner.by_id.get(id).filter(|e| e.tenant == tenant)?;
            (e.response.clone(), e.conversation.clone())
        };
        // Parsed outside the lock: it is the store's own JSON, so it parses.
        Some(Stored {
            response: serde_json::from_str(&response).ok()?,
            conversation: serde_json::from_str(&conversation).ok()?,
        })
    }

    /// Forgets `tenant`'s response `id`, stored or still being generated; whether there was one.
    pub fn delete(&self, id: &str, tenant: Tenant) -> bool {
        let mut inner = self.lock();
        inner.evict(self.limits, Instant::now());
        if inner.pending.get(id) == Some(&tenant) {
            inner.pending.remove(id);
            return true;
        }
        if inner.by_id.get(id).is_some_and(|e| e.tenant == tenant) {
            return inner.remove(id);
        }
        false
    }

    /// Bytes held by stored responses.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ME: Tenant = Tenant::OPEN;

    fn stored(n: u64) -> Stored {
        Stored {
            response: json!({"n": n}),
            conversation: vec![json!({"role": "user", "content": n.to_string()})],
        }
    }

    fn store(count: usize, ttl_s: u64, bytes: usize) -> ResponseStore {
        ResponseStore::new(StoreLimits {
            count,
            ttl: Duration::from_secs(ttl_s),
            bytes,
        })
    }

    /// The tenants of two API keys.
    fn two_tenants() -> (Tenant, Tenant) {
        let keys = crate::server::api_keys::ApiKeys::of(&["k1", "k2"]);
        let tenant = |k: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert("authorization", format!("Bearer {k}").parse().unwrap());
            keys.identify(&h).unwrap()
        };
        (tenant("k1"), tenant("k2"))
    }

    fn put(s: &ResponseStore, id: &str, v: Stored, at: Instant) -> bool {
        s.reserve(id, ME);
        s.put_at(id, v, at)
    }

    #[test]
    fn the_oldest_go_past_the_capacity_and_every_one_past_its_age() {
        let store = store(2, 60, 1 << 20);
        let t0 = Instant::now();
        put(&store, "a", stored(1), t0);
        put(&store, "b", stored(2), t0 + Duration::from_secs(1));
        put(&store, "c", stored(3), t0 + Duration::from_secs(2));
        let now = t0 + Duration::from_secs(3);
        assert!(
            store.get_at("a", ME, now).is_none(),
            "over capacity, oldest out"
        );
        assert_eq!(
            store.get_at("b", ME, now).unwrap().response,
            json!({"n": 2})
        );
        assert_eq!(store.get_at("c", ME, now).unwrap().conversation.len(), 1);
        assert!(
            store
                .get_at("b", ME, t0 + Duration::from_secs(61))
                .is_none(),
            "too old"
        );
        assert!(store
            .get_at("c", ME, t0 + Duration::from_secs(61))
            .is_some());
        assert!(store.delete("c", ME));
        assert!(!store.delete("c", ME));
        assert!(store.get("c", ME).is_none());
        // Deleted ids leave the order without taking a live one with them.
        put(&store, "d", stored(4), t0 + Duration::from_secs(62));
        put(&store, "e", stored(5), t0 + Duration::from_secs(63));
        let later = t0 + Duration::from_secs(64);
        assert!(store.get_at("d", ME, later).is_some() && store.get_at("e", ME, later).is_some());
        assert_eq!(store.bytes(), {
            let inner = store.lock();
            inner.by_id.iter().map(|(id, e)| e.bytes(id)).sum::<usize>()
        });
    }

    #[test]
    fn a_store_of_no_room_keeps_nothing() {
        let store = store(0, 60, 1 << 20);
        assert!(!store.is_on());
        assert!(!put(&store, "a", stored(1), Instant::now()));
        assert!(store.get("a", ME).is_none());
    }

    #[test]
    fn responses_are_seen_only_by_their_tenant() {
        let (one, two) = two_tenants();
        let store = store(10, 60, 1 << 20);
        store.reserve("r", one);
        assert!(store.put("r", stored(1)));
        assert!(store.get("r", two).is_none());
        assert!(store.get("r", ME).is_none());
        assert!(!store.delete("r", two), "another tenant cannot delete it");
        assert!(store.get("r", one).is_some());
        assert!(store.delete("r", one));
    }

    #[test]
    fn the_bytes_kept_are_bounded_and_the_oldest_go_first() {
        let big = |n: u64| Stored {
            response: json!({"n": n, "text": "x".repeat(1000)}),
            conversation: vec![],
        };
        let store = store(100, 60, 3500);
        let t0 = Instant::now();
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            assert!(put(
                &store,
                id,
                big(i as u64),
                t0 + Duration::from_millis(i as u64)
            ));
        }
        assert!(store.bytes() <= 3500, "{}", store.bytes());
        assert!(store.get("a", ME).is_none());
        assert!(store.get("d", ME).is_some() && store.get("c", ME).is_some());
        let huge = Stored {
            response: json!({"text": "y".repeat(4000)}),
            conversation: vec![],
        };
        assert!(!put(&store, "e", huge, t0), "larger than the whole store");
        assert!(store.get("d", ME).is_some(), "and it evicted nothing");
    }

    #[test]
    fn a_tenant_that_floods_the_store_pushes_out_its_own_responses_only() {
        let (victim, flood) = two_tenants();
        let store = store(10, 3600, 1 << 20);
        let t0 = Instant::now();
        store.reserve("v", victim);
        assert!(store.put_at("v", stored(0), t0));
        for i in 0..1000u64 {
            let id = format!("f{i}");
            store.reserve(&id, flood);
            assert!(store.put_at(&id, stored(i), t0 + Duration::from_millis(i + 1)));
        }
        assert!(
            store.get("v", victim).is_some(),
            "the victim's response stays"
        );
        assert!(store.get("f999", flood).is_some() && store.get("f0", flood).is_none());
        let inner = store.lock();
        assert_eq!(inner.by_id.len(), 10);
        assert!(inner.order.len() <= 2 * 10 + 64, "{}", inner.order.len());
        assert_eq!(inner.by_tenant.values().sum::<usize>(), inner.bytes);
    }

    #[test]
    fn a_response_deleted_while_in_flight_is_never_stored() {
        let store = store(10, 60, 1 << 20);
        store.reserve("r", ME);
        assert!(store.delete("r", ME));
        assert!(!store.put("r", stored(1)));
        assert!(store.get("r", ME).is_none());
        assert!(!store.put("never-reserved", stored(2)));
        store.reserve("s", ME);
        store.release("s");
        assert!(!store.put("s", stored(3)));
    }
}
