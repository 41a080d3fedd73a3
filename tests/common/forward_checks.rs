//! Checks on the model's forward that several test files run on different models and
//! backends: batching, token trees against the linear forward of their paths, and how far two
//! forwards' next-token distributions lie apart.

use tandem::model::{Decoder, Kept, KvCache, LogitsRows, SeqInput};

/// One sequence's forward from its slot's current length; the rows asked for.
pub fn forward_rows(
    model: &Decoder,
    cache: &mut KvCache,
    slot: usize,
    tokens: &[u32],
    rows: LogitsRows,
) -> Vec<Vec<f32>> {
    let start_pos = cache.len(slot).unwrap();
    model
        .forward(
            cache,
            &[SeqInput {
                slot,
                start_pos,
                tokens,
                logits: rows,
                parents: &[],
            }],
        )
        .unwrap()
        .seq_rows(0)
        .unwrap()
}

/// One forward over several sequences of different lengths == each sequence alone.
pub fn batched_equals_alone(model: &Decoder, seqs: &[(Vec<u32>, Vec<u32>)]) {
    let mut cache = model.new_cache(seqs.len() * 2);
    let mut alone = Vec::new();
    let mut slots = Vec::new();
    for (prefix, new) in seqs {
        let s = cache.allocate().unwrap();
        forward_rows(model, &mut cache, s, prefix, LogitsRows::None);
        alone.push(forward_rows(model, &mut cache, s, new, LogitsRows::All));
        let t = cache.allocate().unwrap();
        forward_rows(model, &mut cache, t, prefix, LogitsRows::None);
        slots.push(t);
    }
    let inputs: Vec<SeqInput> = seqs
        .iter()
        .zip(&slots)
        .map(|((prefix, new), &slot)| SeqInput {
            slot,
            start_pos: prefix.len(),
            tokens: new,
            logits: LogitsRows::All,
            parents: &[],
        })
        .collect();
    let out = model.forward(&mut cache, &inputs).unwrap();
    for (i, want) in alone.iter().enumerate() {
        assert!(
            &out.seq_rows(i).unwrap() == want,
            "sequence {i} differs when batched"
        );
    }
}

/// A test tree over 8 input tokens: the first chain 0 → 1 → 2 → 3, a branch 0 → 4 → 5 and a
/// branch 1 → 6 → 7 (input parents, as `SeqInput::parents` takes them).
pub const TEST_TREE: [u32; 8] = [tandem::model::TREE_ROOT, 0, 1, 2, 0, 4, 1, 6];

/// Node `k`'s path from the first input token down (itself included).
pub fn tree_path(parents: &[u32], k: usize) -> Vec<usize> {
    let mut path = vec![k];
    let mut at = k;
    while at != 0 {
        at = parents[at] as usize;
        path.push(at);
    }
    path.reverse();
    path
}

/// A tree forward after `prefix` gives each node the bits of the linear forward of its path,
/// also beside another sequence in the same forward; keeping a path (`KvCache::keep`) leaves the
/// cache as feeding that path alone would (the next tokens' logits are the same bits).
/// `same` compares two rows (bitwise for the own kernels).
pub fn tree_equals_its_paths(
    model: &Decoder,
    prefix: &[u32],
    tokens: &[u32],
    parents: &[u32],
    same: &dyn Fn(&[f32], &[f32]) -> bool,
) {
    let mut cache = model.new_cache(4);
    let (t, other) = (cache.allocate().unwrap(), cache.allocate().unwrap());
    forward_rows(model, &mut cache, t, prefix, LogitsRows::None);
    forward_rows(
        model,
        &mut cache,
        other,
        &prefix[..prefix.len() / 2],
        LogitsRows::None,
    );
    let other_new = &prefix[prefix.len() / 2..prefix.len() / 2 + 3];
    let out = model
        .forward(
            &mut cache,
            &[
                SeqInput {
                    slot: other,
                    start_pos: prefix.len() / 2,
                    tokens: other_new,
                    logits: LogitsRows::All,
                    parents: &[],
                },
                SeqInput {
                    slot: t,
                    start_pos: prefix.len(),
                    tokens,
                    logits: LogitsRows::All,
                    parents,
                },
            ],
        )
        .unwrap();
    let tree_rows = out.seq_rows(1).unwrap();
    assert_eq!(tree_rows.len(), tokens.len());
    assert_eq!(cache.len(t).unwrap(), prefix.len() + tokens.len());
    let lin = cache.allocate().unwrap();
    for k in 0..tokens.len() {
        let path = tree_path(parents, k);
        let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
        cache.copy_prefix(t, lin, prefix.len()).unwrap();
        let rows = forward_rows(model, &mut cache, lin, &path_tokens, LogitsRows::All);
        for (d, &i) in path.iter().enumerate() {
            assert!(
                same(&rows[d], &tree_rows[i]),
                "tree node {i} (on the path to {k}) differs from the linear forward of its path"
            );
        }
        cache.free(lin).unwrap();
        cache.allocate_slot(lin).unwrap();
    }
    // Keep the deepest path of the last branch, then feed three more tokens.
    let path = tree_path(parents, tokens.len() - 1);
    let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
    cache
        .keep(
            t,
            Kept::Path {
                start: prefix.len(),
                rows: &path,
            },
        )
        .unwrap();
    assert_eq!(cache.len(t).unwrap(), prefix.len() + path.len());
    let next = [tokens[0], tokens[1], tokens[0]];
    let after_tree = forward_rows(model, &mut cache, t, &next, LogitsRows::All);
    cache.copy_prefix(t, lin, prefix.len()).unwrap();
    forward_rows(model, &mut cache, lin, &path_tokens, LogitsRows::None);
    let after_linear = forward_rows(model, &mut cache, lin, &next, LogitsRows::All);
    for (a, b) in after_tree.iter().zip(&after_linear) {
        assert!(
            same(a, b),
            "the kept path's cache differs from feeding it linearly"
        );
    }
}

/// KL(p ‖ q) of the softmax distributions of two logit rows.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |v: &[f32]| {
        let m = v.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let z = v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        v.iter().map(|&x| x as f64 - z).collect::<Vec<f64>>()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}
