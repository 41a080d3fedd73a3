//! The prefix store's algebra on small caches whose "keys and values" are a function of the
//! text up to each position, as a model's are: whatever is stored, split, evicted or rolled
//! back, a slot loaded from the store holds exactly what computing its text would have left.

use candle_core::{Device, Tensor};

use super::*;
use crate::model::cache::kv_cache::LayerKv;
use crate::model::kernels::attention::KvRows;
use crate::model::{Kept, KvDtype};

const LAYERS: usize = 2;
const KV_HEADS: usize = 2;
// 32 elements a row: one q8_0 block.
const HEAD_DIM: usize = 16;
const KV_DIM: usize = KV_HEADS * HEAD_DIM;

/// A position's value in layer `layer`, element `e`: depends on every token up to it.
fn value(text: &[u32], layer: usize, e: usize, key: bool) -> f32 {
    let mut h: u64 = 1469598103934665603 ^ (layer as u64) << 8 ^ (e as u64) << 16 ^ key as u64;
    for &t in text {
        h = (h ^ u64::from(t)).wrapping_mul(1099511628211);
    }
    (h % 10_000) as f32 / 100.0 - 50.0
}

fn rows(text: &[u32], from: usize, layer: usize, key: bool) -> Vec<f32> {
    (from..text.len())
        .flat_map(|p| (0..KV_DIM).map(move |e| value(&text[..=p], layer, e, key)))
        .collect()
}

/// What a forward over `text[held..]` would append to `slot` (which holds `text[..held]`).
fn compute(cache: &mut KvCache, slot: usize, text: &[u32]) {
    if !cache.is_allocated(slot) {
        cache.allocate_slot(slot).unwrap();
    }
    let held = cache.len(slot).unwrap();
    for layer in 0..LAYERS {
        let (k, v) = (
            rows(text, held, layer, true),
            rows(text, held, layer, false),
        );
        if cache.is_on_device() {
            let shape = (text.len() - held, KV_HEADS, HEAD_DIM);
            let t = |x: Vec<f32>| {
                Tensor::from_vec(x, shape, &Device::Cpu)
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap()
            };
            cache.ensure_device_capacity(slot, text.len()).unwrap();
            cache
                .write_device_layer(slot, layer, held, &t(k), &t(v))
                .unwrap();
        } else {
            cache.append_layer(slot, layer, &k, &v).unwrap();
        }
    }
    cache.commit_len(slot, text.len()).unwrap();
}

/// Every layer's keys and values of a slot, as f32, token-major.
fn contents(cache: &KvCache, slot: usize) -> Vec<Vec<f32>> {
    let len = cache.len(slot).unwrap();
    let mut out = Vec::new();
    for layer in 0..LAYERS {
        if cache.is_on_device() {
            let (k, v) = cache.device_layer(slot, layer, len).unwrap();
            for t in [k, v] {
                let t = t.transpose(0, 1).unwrap().contiguous().unwrap();
                let t = t.to_dtype(candle_core::DType::F32).unwrap();
                out.push(t.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            }
        } else {
            match cache.layer(slot, layer).unwrap() {
                LayerKv::F32 { keys, values } => {
                    out.push(keys.to_vec());
                    out.push(values.to_vec());
                }
                LayerKv::F16 { keys, values } => {
                    out.push(keys.iter().map(|x| x.to_f32()).collect());
                    out.push(values.iter().map(|x| x.to_f32()).collect());
                }
                LayerKv::Bf16 { keys, values } => {
                    out.push(keys.iter().map(|x| x.to_f32()).collect());
                    out.push(values.iter().map(|x| x.to_f32()).collect());
                }
                LayerKv::Q8 { keys, values } => {
                    for rows in [keys, values] {
                        out.push((0..rows.elements()).map(|i| rows.get(i)).collect());
                    }
                }
            }
        }
    }
    out
}

fn caches() -> Vec<(&'static str, KvCache)> {
    vec![
        (
            "host f32",
            KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::F32),
        ),
        (
            "host f16",
            KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::F16),
        ),
        (
            "host bf16",
            KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::Bf16),
        ),
        (
            "host q8_0",
            KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::Q8_0),
        ),
        (
            "device f32",
            KvCache::on_device(
                LAYERS,
                KV_HEADS,
                HEAD_DIM,
                6,
                256,
                KvDtype::F32,
                &Device::Cpu,
            ),
        ),
        (
            "device f16",
            KvCache::on_device(
                LAYERS,
                KV_HEADS,
                HEAD_DIM,
                6,
                256,
                KvDtype::F16,
                &Device::Cpu,
            ),
        ),
    ]
}

/// What a slot holding exactly `text`, computed afresh, holds.
fn fresh(cache: &mut KvCache, spare: usize, text: &[u32]) -> Vec<Vec<f32>> {
    compute(cache, spare, text);
    let want = contents(cache, spare);
    cache.free(spare).unwrap();
    want
}

/// Stores `text` as a finished sequence would leave it.
fn finish(store: &mut PrefixStore, cache: &mut KvCache, text: &[u32]) {
    compute(cache, 0, text);
    store.insert(cache, 0, 0, text).unwrap();
    cache.free(0).unwrap();
}

/// Loads `prompt`'s cached start into slot 1, checks its bits against computing it, frees it;
/// the tokens it loaded.
fn check_load(
    name: &str,
    store: &mut PrefixStore,
    cache: &mut KvCache,
    prompt: &[u32],
    limit: usize,
) -> usize {
    let n = store.load(cache, 1, 0, prompt, limit).unwrap();
    assert_eq!(n, store.longest(0, prompt, limit), "{name}");
    if n > 0 {
        let got = contents(cache, 1);
        assert_eq!(got, fresh(cache, 5, &prompt[..n]), "{name}: {prompt:?}");
    }
    if cache.is_allocated(1) {
        cache.free(1).unwrap();
    }
    n
}

fn text(start: u32, len: usize) -> Vec<u32> {
    (start..start + len as u32).collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

#[test]
fn a_shared_start_is_stored_once_and_loads_the_bits_of_computing_it() {
    for (name, mut cache) in caches() {
        let bpt = cache.bytes_per_token();
        let mut store = PrefixStore::new(1 << 20, bpt);
        let system = text(100, 20);
        let a = cat(&[&system, &text(1, 7)]);
        let b = cat(&[&system, &text(50, 5)]);
        finish(&mut store, &mut cache, &a);
        finish(&mut store, &mut cache, &b);
        let s = store.stats();
        assert_eq!(s.tokens, 20 + 7 + 5, "{name}: the system prompt once");
        assert_eq!(s.runs, 3, "{name}: split where the texts part");
        assert_eq!(s.bytes, s.tokens * bpt);
        // Whole texts, a run's boundary, the middle of a run, past what is stored, a limit.
        let c = cat(&[&system, &text(1, 3), &[999]]);
        for (prompt, limit, want) in [
            (cat(&[&a, &[7, 7]]), usize::MAX, a.len()),
            (b.clone(), b.len() - 1, b.len() - 1),
            (cat(&[&system, &[888]]), usize::MAX, 20),
            (c.clone(), usize::MAX, 23),
            (c.clone(), 10, 10),
            (text(100, 3), usize::MAX, 3),
            (vec![5, 100], usize::MAX, 0),
        ] {
            assert_eq!(
                check_load(name, &mut store, &mut cache, &prompt, limit),
                want
            );
        }
        // A conversation's next turn extends its stored text: only the new tokens are added.
        let a2 = cat(&[&a, &text(300, 9)]);
        finish(&mut store, &mut cache, &a2);
        assert_eq!(store.stats().tokens, 20 + 7 + 5 + 9, "{name}");
        assert_eq!(
            check_load(name, &mut store, &mut cache, &a2, usize::MAX),
            a2.len()
        );
        // A text the tree holds already adds nothing.
        finish(&mut store, &mut cache, &system);
        assert_eq!(store.stats().tokens, 41, "{name}");
        // A split in the middle of a run that has children keeps every descendant reachable.
        let d = cat(&[&system[..10], &[4242]]);
        finish(&mut store, &mut cache, &d);
        assert_eq!(store.stats().tokens, 42, "{name}");
        for t in [&a2, &b, &d] {
            assert_eq!(
                check_load(name, &mut store, &mut cache, t, usize::MAX),
                t.len()
            );
        }
    }
}

#[test]
fn eviction_keeps_the_budget_and_takes_the_least_recently_used_leaf() {
    for (name, mut cache) in caches() {
        let bpt = cache.bytes_per_token();
        let mut store = PrefixStore::new(40 * bpt, bpt);
        let system = text(100, 10);
        let convs: Vec<Vec<u32>> = (0..4)
            .map(|i| cat(&[&system, &text(1000 * (i + 1), 8)]))
            .collect();
        for c in &convs[..3] {
            finish(&mut store, &mut cache, c);
        }
        assert_eq!(store.stats().tokens, 34);
        // Reading the first makes the second the least recently used.
        check_load(name, &mut store, &mut cache, &convs[0], usize::MAX);
        finish(&mut store, &mut cache, &convs[3]);
        let s = store.stats();
        assert!(s.bytes <= s.budget_bytes, "{name}: {s:?}");
        assert_eq!((s.tokens, s.evictions), (34, 1), "{name}");
        assert_eq!(
            store.longest(0, &convs[1], usize::MAX),
            10,
            "{name}: its own run went"
        );
        for c in [&convs[0], &convs[2], &convs[3]] {
            assert_eq!(check_load(name, &mut store, &mut cache, c, usize::MAX), 18);
        }
        // A text longer than the whole budget keeps what fits of its start.
        let long = text(5000, 60);
        finish(&mut store, &mut cache, &long);
        let s = store.stats();
        assert_eq!(s.tokens, 40, "{name}: {s:?}");
        assert_eq!(
            check_load(name, &mut store, &mut cache, &long, usize::MAX),
            40
        );
        assert_eq!(store.longest(0, &convs[0], usize::MAX), 0, "{name}");
        store.clear();
        assert_eq!(store.stats().tokens, 0);
        assert_eq!(
            check_load(name, &mut store, &mut cache, &long, usize::MAX),
            0
        );
    }
    let mut cache = KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::F32);
    let mut none = PrefixStore::new(0, cache.bytes_per_token());
    finish(&mut none, &mut cache, &text(1, 5));
    assert_eq!(none.stats().tokens, 0, "a zero budget stores nothing");
}

#[test]
fn rolling_a_loaded_slot_back_never_reaches_the_store() {
    for (name, mut cache) in caches() {
        let bpt = cache.bytes_per_token();
        let mut store = PrefixStore::new(1 << 20, bpt);
        let a = text(10, 30);
        finish(&mut store, &mut cache, &a);
        // A sequence starts from the stored text, drafts, is rolled back into the stored
        // part, and writes other tokens there.
        assert_eq!(store.load(&mut cache, 2, 0, &a, 30).unwrap(), 30);
        compute(&mut cache, 2, &cat(&[&a, &[1, 2, 3, 4]]));
        cache.keep(2, Kept::First(12)).unwrap();
        compute(&mut cache, 2, &cat(&[&a[..12], &[77; 9]]));
        cache.free(2).unwrap();
        assert_eq!(check_load(name, &mut store, &mut cache, &a, usize::MAX), 30);
        // A slot loaded twice in a row holds both runs' tokens in order.
        let b = cat(&[&a[..5], &[61, 62]]);
        finish(&mut store, &mut cache, &b);
        assert_eq!(check_load(name, &mut store, &mut cache, &b, usize::MAX), 7);
    }
}

#[test]
fn a_scope_sees_only_its_own_texts_and_shares_the_budget() {
    let mut cache = KvCache::new(LAYERS, KV_DIM, 6, 256, KvDtype::F32);
    let bpt = cache.bytes_per_token();
    let mut store = PrefixStore::new(30 * bpt, bpt);
    let a = text(10, 12);
    compute(&mut cache, 0, &a);
    store.insert(&cache, 0, 7, &a).unwrap();
    // Scope 7's text is not another scope's, nor the shared scope's.
    assert_eq!(store.longest(7, &a, usize::MAX), 12);
    assert_eq!(store.longest(8, &a, usize::MAX), 0);
    assert_eq!(store.longest(0, &a, usize::MAX), 0);
    assert_eq!(store.load(&mut cache, 1, 8, &a, usize::MAX).unwrap(), 0);
    assert!(!cache.is_allocated(1), "nothing loaded");
    // The same text in another scope is stored again: a scope's tree is its own.
    store.insert(&cache, 0, 8, &a).unwrap();
    assert_eq!(store.stats().tokens, 24);
    assert_eq!(store.load(&mut cache, 1, 8, &a, usize::MAX).unwrap(), 12);
    assert_eq!(contents(&cache, 1), fresh(&mut cache, 5, &a));
    cache.free(1).unwrap();
    // One budget for all scopes: the least recently used text goes, whatever its scope, and
    // a scope left empty is forgotten.
    store.insert(&cache, 0, 0, &a).unwrap();
    let s = store.stats();
    assert_eq!((s.tokens, s.runs, s.evictions), (24, 2, 1), "{s:?}");
    assert_eq!(store.longest(7, &a, usize::MAX), 0);
    assert!(!store.roots.contains_key(&7));
    assert_eq!(store.longest(0, &a, usize::MAX), 12);
    cache.free(0).unwrap();
}
