//! Cache algebra and batch invariance, checked bitwise: a token's logits must not depend on how
//! many tokens share its forward pass, or on whether its cache was rolled back and refilled —
//! greedy speculative decoding relies on exactly this to equal plain greedy decoding. A token
//! tree's nodes must likewise give the bits of the linear forward of their paths.

mod common;

use tandem::model::{
    Decoder, Kept, KvCache, KvDtype, LoadedModel, LogitsRows, SeqInput, WeightsDtype,
};

/// k tokens in one forward (all rows) == k one-token forwards, after a shared prefix.
fn multi_token_equals_single_steps(model: &Decoder, prefix: &[u32], tail: &[u32]) {
    let mut cache = model.new_cache(2);
    let a = cache.allocate().unwrap();
    let b = cache.allocate().unwrap();
    common::forward_rows(model, &mut cache, a, prefix, LogitsRows::None);
    common::forward_rows(model, &mut cache, b, prefix, LogitsRows::None);
    let together = common::forward_rows(model, &mut cache, a, tail, LogitsRows::All);
    let one_by_one: Vec<Vec<f32>> = tail
        .iter()
        .flat_map(|t| {
            common::forward_rows(
                model,
                &mut cache,
                b,
                std::slice::from_ref(t),
                LogitsRows::Last,
            )
        })
        .collect();
    assert_eq!(together.len(), tail.len());
    for (i, (x, y)) in together.iter().zip(&one_by_one).enumerate() {
        assert!(
            x == y,
            "row {i} of a {}-token forward differs from its single-token forward",
            tail.len()
        );
    }
}

/// Truncating and re-feeding gives the same logits as a fresh run.
fn truncate_and_refeed_equals_fresh(model: &Decoder, prompt: &[u32], wrong: &[u32], right: &[u32]) {
    let mut cache = model.new_cache(2);
    let a = cache.allocate().unwrap();
    common::forward_rows(model, &mut cache, a, prompt, LogitsRows::None);
    common::forward_rows(model, &mut cache, a, wrong, LogitsRows::All);
    cache.keep(a, Kept::First(prompt.len())).unwrap();
    assert_eq!(cache.len(a).unwrap(), prompt.len());
    let refed = common::forward_rows(model, &mut cache, a, right, LogitsRows::All);
    let b = cache.allocate().unwrap();
    let full: Vec<u32> = prompt.iter().chain(right).copied().collect();
    let fresh = common::forward_rows(model, &mut cache, b, &full, LogitsRows::All);
    assert!(
        refed[..] == fresh[prompt.len()..],
        "refed logits differ from a fresh run"
    );
}

fn check_all(loaded: &LoadedModel, vocab: usize) {
    let m = &loaded.model;
    let prefix = common::random_tokens(11, 37, vocab);
    for k in [2, 5, 9] {
        multi_token_equals_single_steps(m, &prefix, &common::random_tokens(k as u64, k, vocab));
    }
    common::tree_equals_its_paths(
        m,
        &prefix,
        &common::random_tokens(12, common::TEST_TREE.len(), vocab),
        &common::TEST_TREE,
        &|a, b| a == b,
    );
    truncate_and_refeed_equals_fresh(
        m,
        &prefix,
        &common::random_tokens(3, 6, vocab),
        &common::random_tokens(4, 4, vocab),
    );
    common::batched_equals_alone(
        m,
        &[
            (
                common::random_tokens(5, 3, vocab),
                common::random_tokens(6, 5, vocab),
            ),
            (
                common::random_tokens(7, 40, vocab),
                common::random_tokens(8, 1, vocab),
            ),
            (
                common::random_tokens(9, 17, vocab),
                common::random_tokens(10, 9, vocab),
            ),
        ],
    );
}

/// A tiny model with hidden size 256, so q4k and the repacked x86 kernels (k a multiple of
/// 256) are exercised too.
fn wide_tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(
        dir.path(),
        &common::TinySpec {
            hidden: 256,
            intermediate: 512,
            heads: 4,
            kv_heads: 2,
            ..Default::default()
        },
    );
    dir
}

#[test]
fn tiny_model_every_weight_type() {
    let dir = wide_tiny_model();
    for dtype in [
        WeightsDtype::AsIs,
        WeightsDtype::F32,
        WeightsDtype::F16,
        WeightsDtype::BF16,
        WeightsDtype::Q8_0,
        WeightsDtype::Q4_0,
        WeightsDtype::Q4_1,
        WeightsDtype::Q4K,
    ] {
        let loaded = common::load_tiny(dir.path(), dtype);
        check_all(&loaded, 256);
    }
}

#[test]
fn real_model_q8_0_f16_and_its_own_q4_1() {
    for dtype in [WeightsDtype::Q8_0, WeightsDtype::F16, WeightsDtype::AsIs] {
        let loaded = common::load_default(dtype);
        check_all(&loaded, 49152);
    }
}

/// An f16 cache rounds keys and values once, as they are stored, so the algebra above holds
/// bit for bit with it too: on the tiny model (f32 and 4-bit weights) and the real one.
#[test]
fn f16_kv_cache_keeps_the_algebra() {
    let dir = wide_tiny_model();
    for dtype in [WeightsDtype::F32, WeightsDtype::Q4_0] {
        let mut loaded = common::load_tiny(dir.path(), dtype);
        loaded.model = loaded.model.with_kv_dtype(KvDtype::F16);
        check_all(&loaded, 256);
    }
    let mut loaded = common::load_default(WeightsDtype::F16);
    loaded.model = loaded.model.with_kv_dtype(KvDtype::F16);
    assert_eq!(loaded.model.new_cache(1).dtype(), KvDtype::F16);
    check_all(&loaded, 49152);
}

/// The f16 cache stays close to the f32 one on the real model: over a 300-token context every
/// position's logits are within a small distance of the f32 cache's, and the top token agrees
/// nearly everywhere (random tokens make many near-ties, so not always).
#[test]
fn f16_kv_cache_stays_close_to_f32_on_the_real_model() {
    let f32_model = common::load_default(WeightsDtype::F16).model;
    let f16_model = common::load_default(WeightsDtype::F16)
        .model
        .with_kv_dtype(KvDtype::F16);
    let tokens = common::random_tokens(21, 300, 49152);
    let logits = |m: &Decoder| {
        let mut cache = m.new_cache(1);
        let s = cache.allocate().unwrap();
        let mut rows = Vec::new();
        for chunk in tokens.chunks(64) {
            rows.extend(common::forward_rows(
                m,
                &mut cache,
                s,
                chunk,
                LogitsRows::All,
            ));
        }
        rows
    };
    let (a, b) = (logits(&f32_model), logits(&f16_model));
    let argmax = |r: &[f32]| {
        r.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .unwrap()
            .0
    };
    let mut agree = 0;
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(&b) {
        let diff = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        worst = worst.max(diff);
        agree += usize::from(argmax(x) == argmax(y));
    }
    assert!(a != b, "the f16 cache must really round");
    assert!(worst < TOLERANCE, "largest logit difference {worst}");
    assert!(
        agree * 100 >= a.len() * 97,
        "top token agrees at {agree} of {}",
        a.len()
    );
}

/// Largest logit difference allowed between the two caches over the test's 300 positions:
/// measured 0.075 (logits span about ±20), with the top token agreeing at 299 of 300; this
/// leaves room for other machines' kernels, while a cache that rounded to fewer bits, or
/// mixed up positions, moves logits by whole units.
const TOLERANCE: f32 = 0.25;

#[test]
fn an_f16_cache_holds_half_the_bytes() {
    let (_dir, loaded) = tiny_f32();
    let f32_cache = loaded.model.new_cache(1);
    let model = loaded.model.with_kv_dtype(KvDtype::F16);
    let mut cache = model.new_cache(1);
    assert_eq!(2 * cache.bytes_per_token(), f32_cache.bytes_per_token());
    let a = cache.allocate().unwrap();
    common::forward_rows(
        &model,
        &mut cache,
        a,
        &common::random_tokens(1, 10, 256),
        LogitsRows::Last,
    );
    let bytes = cache.slot_memory_bytes(a);
    assert!(bytes >= 10 * cache.bytes_per_token(), "{bytes}");
    cache.keep(a, Kept::First(3)).unwrap();
    assert_eq!(
        cache.slot_memory_bytes(a),
        bytes,
        "truncation keeps the memory"
    );
}

/// The default tiny model with f32 weights (the folder lives as long as the returned guard).
fn tiny_f32() -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), &common::TinySpec::default());
    let loaded = common::load_tiny(dir.path(), WeightsDtype::F32);
    (dir, loaded)
}

#[test]
fn cache_slots_truncate_free_and_report_memory() {
    let (_dir, loaded) = tiny_f32();
    let m = &loaded.model;
    let mut cache = m.new_cache(2);
    let a = cache.allocate().unwrap();
    let b = cache.allocate().unwrap();
    assert!(cache.allocate().is_none(), "only two slots");
    assert_eq!(cache.slot_memory_bytes(a), 0);
    common::forward_rows(
        m,
        &mut cache,
        a,
        &common::random_tokens(1, 10, 256),
        LogitsRows::Last,
    );
    assert_eq!(cache.len(a).unwrap(), 10);
    assert!(cache.slot_memory_bytes(a) >= 10 * cache.bytes_per_token());
    assert_eq!(cache.slot_memory_bytes(b), 0);
    assert!(
        cache.keep(a, Kept::First(11)).is_err(),
        "cannot grow by truncation"
    );
    cache.keep(a, Kept::First(4)).unwrap();
    assert_eq!(cache.len(a).unwrap(), 4);
    cache.free(a).unwrap();
    assert_eq!(cache.slot_memory_bytes(a), 0);
    assert!(cache.len(a).is_err());
    assert_eq!(cache.free_slots(), 1);
    assert_eq!(cache.allocate(), Some(a));
}

#[test]
fn bad_forward_inputs_are_rejected_and_leave_the_cache_alone() {
    let (_dir, loaded) = tiny_f32();
    let m = &loaded.model;
    let mut cache = m.new_cache(2);
    let a = cache.allocate().unwrap();
    common::forward_rows(m, &mut cache, a, &[1, 2, 3], LogitsRows::Last);
    let bad = |cache: &mut KvCache, input: SeqInput| {
        m.forward(cache, &[input]).err().map(|e| e.to_string())
    };
    let e = bad(
        &mut cache,
        SeqInput {
            slot: a,
            start_pos: 1,
            tokens: &[4],
            logits: LogitsRows::Last,
            parents: &[],
        },
    )
    .unwrap();
    assert!(e.contains("KvCache::keep"), "{e}");
    let e = bad(
        &mut cache,
        SeqInput {
            slot: a,
            start_pos: 3,
            tokens: &[9999],
            logits: LogitsRows::Last,
            parents: &[],
        },
    )
    .unwrap();
    assert!(e.contains("vocabulary"), "{e}");
    let long = vec![1u32; m.context_len()];
    let e = bad(
        &mut cache,
        SeqInput {
            slot: a,
            start_pos: 3,
            tokens: &long,
            logits: LogitsRows::Last,
            parents: &[],
        },
    )
    .unwrap();
    assert!(e.contains("context length"), "{e}");
    let e = bad(
        &mut cache,
        SeqInput {
            slot: 1,
            start_pos: 0,
            tokens: &[1],
            logits: LogitsRows::Last,
            parents: &[],
        },
    )
    .unwrap();
    assert!(e.contains("not allocated"), "{e}");
    assert_eq!(
        cache.len(a).unwrap(),
        3,
        "failed forwards must not change the cache"
    );
}
