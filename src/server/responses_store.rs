//! Stored responses (`store: true`, the Responses API's default): what `GET /v1/responses/{id}`
//! returns and what `previous_response_id` continues from, in memory, bounded in count and in
//! age (`server.responses_stored`, `server.responses_ttl_seconds`), per replica.
//!
//! Why it exists: a conversation continued by id must find its earlier turns, and a server
//! must not grow without bound keeping them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One stored response.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The response object, as returned.
    pub response: Value,
    /// The whole conversation up to and with its answer, as chat messages (instructions
    /// excepted: they do not carry over).
    pub conversation: Vec<Value>,
}

pub struct ResponseStore {
    capacity: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, (Instant, Stored)>,
    /// Ids, oldest first (an id deleted early stays here until it reaches the front).
    order: VecDeque<(Instant, String)>,
}

impl Inner {
    fn evict(&mut self, capacity: usize, ttl: Duration, now: Instant) {
        while let Some((at, id)) = self.order.front() {
            let stale = now.duration_since(*at) >= ttl;
            let gone = self.by_id.get(id).is_none_or(|(t, _)| t != at);
            if !(stale || gone || self.by_id.len() > capacity) {
                break;
            }
            if !gone {
                self.by_id.remove(id);
            }
            self.order.pop_front();
        }
    }
}

impl ResponseStore {
    /// Keeps at most `capacity` responses (0: none), each for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn is_on(&self) -> bool {
        self.capacity > 0
    }

    pub fn put(&self, id: &str, stored: Stored) {
        self.put_at(id, stored, Instant::now());
    }

    fn put_at(&self, id: &str, stored: Stored, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().expect("store lock");
        inner.by_id.insert(id.to_string(), (now, stored));
        inner.order.push_back((now, id.to_string()));
        inner.evict(self.capacity, self.ttl, now);
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Stored> {
        let mut inner = self.inner.lock().expect("store lock");
        inner.evict(self.capacity, self.ttl, now);
        inner.by_id.get(id).map(|(_, s)| s.clone())
    }

    /// Forgets a response; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self.inner.lock().expect("store lock");
        inner.evict(self.capacity, self.ttl, Instant::now());
        inner.by_id.remove(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(n: u64) -> Stored {
        Stored {
            response: json!({"n": n}),
            conversation: vec![json!({"role": "user", "content": n.to_string()})],
        }
    }

    #[test]
    fn the_oldest_go_past_the_capacity_and_every_one_past_its_age() {
        let store = ResponseStore::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        store.put_at("a", stored(1), t0);
        store.put_at("b", stored(2), t0 + Duration::from_secs(1));
        store.put_at("c", stored(3), t0 + Duration::from_secs(2));
        let now = t0 + Duration::from_secs(3);
        assert!(
            store.get_at("a", now).is_none(),
            "over capacity, oldest out"
        );
        assert_eq!(store.get_at("b", now).unwrap().response, json!({"n": 2}));
        assert_eq!(store.get_at("c", now).unwrap().conversation.len(), 1);
        assert!(
            store.get_at("b", t0 + Duration::from_secs(61)).is_none(),
            "too old"
        );
        assert!(store.get_at("c", t0 + Duration::from_secs(61)).is_some());
        assert!(store.delete("c"));
        assert!(!store.delete("c"));
        assert!(store.get("c").is_none());
        // Deleted ids leave the order without taking a live one with them.
        store.put_at("d", stored(4), t0 + Duration::from_secs(62));
        store.put_at("e", stored(5), t0 + Duration::from_secs(63));
        let later = t0 + Duration::from_secs(64);
        assert!(store.get_at("d", later).is_some() && store.get_at("e", later).is_some());
    }

    #[test]
    fn a_store_of_no_room_keeps_nothing() {
        let store = ResponseStore::new(0, Duration::from_secs(60));
        assert!(!store.is_on());
        store.put("a", stored(1));
        assert!(store.get("a").is_none());
    }
}
