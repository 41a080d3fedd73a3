//! The tree walk proven exact by running [`accept_tree_sampled`] down every branch of its random
//! choices (the same enumerator as the chain rule's proofs), over every way the drafts could
//! have been drawn: the emitted tokens, extended by plain sampling to a fixed length, must be
//! distributed exactly as plain sampling from p (to 1e-6). Greedy walks must emit the longest
//! prefix of plain greedy decoding that the tree holds, plus the target's next token.

use std::collections::BTreeMap;

use super::*;
use crate::sampling::enumeration::{dist, extend_plainly, Enumerator};

type Dist = dyn Fn(&[u32]) -> Vec<f32>;

/// How one node of a test tree is proposed.
#[derive(Clone, Copy)]
enum Proposed {
    /// Drawn from its own proposal `q(seed, context)` (enumerated over every token).
    Drawn(u64),
    /// A point mass on the `rank`-th most likely token under `Drawn(seed)` at its context that
    /// no earlier sibling holds (chosen deterministically, as a top-k branch is).
    Rank(u64, usize),
}

/// A test tree's shape: per node, its parent and how it is proposed.
struct Shape(Vec<(u32, Proposed)>);

/// One way the tree's tokens came out: the tokens, each node's q row (`None`: a point mass),
/// and its probability.
type Draw = (Vec<u32>, Vec<Option<Vec<f32>>>, f64);

/// Every way the tree's tokens could come out, with its probability, and each node's q row.
fn draws(shape: &Shape, q_of: &dyn Fn(u64, &[u32]) -> Vec<f32>) -> Vec<Draw> {
    let mut all = vec![(Vec::<u32>::new(), Vec::<Option<Vec<f32>>>::new(), 1.0)];
    for (i, &(parent, how)) in shape.0.iter().enumerate() {
        let mut next = Vec::new();
        for (tokens, rows, w) in all {
            let ctx = context_of(&shape.0, &tokens, parent);
            let siblings: Vec<u32> = (0..i)
                .filter(|&j| shape.0[j].0 == parent)
                .map(|j| tokens[j])
                .collect();
            match how {
                Proposed::Drawn(seed) => {
                    let q = q_of(seed, &ctx);
                    for (x, &qx) in q.iter().enumerate() {
                        if qx > 0.0 {
                            let mut t = tokens.clone();
                            t.push(x as u32);
                            let mut r = rows.clone();
                            r.push(Some(q.clone()));
                            next.push((t, r, w * qx as f64));
                        }
                    }
                }
                Proposed::Rank(seed, rank) => {
                    let q = q_of(seed, &ctx);
                    let mut order: Vec<u32> = (0..q.len() as u32)
                        .filter(|x| !siblings.contains(x))
                        .collect();
                    order.sort_by(|&a, &b| q[b as usize].total_cmp(&q[a as usize]).then(a.cmp(&b)));
                    let mut t = tokens.clone();
                    t.push(order[rank.min(order.len() - 1)]);
                    let mut r = rows.clone();
                    r.push(None);
                    next.push((t, r, w));
                }
            }
        }
        all = next;
    }
    all
}

/// The tokens from the root down to (and including) `node`.
fn context_of(shape: &[(u32, Proposed)], tokens: &[u32], node: u32) -> Vec<u32> {
    let mut ctx = Vec::new();
    let mut at = node;
    while at != TREE_ROOT {
        ctx.push(tokens[at as usize]);
        at = shape[at as usize].0;
    }
    ctx.reverse();
    ctx
}

/// The distribution of `len`-token outputs: every draw of the tree, every branch of the walk,
/// the emitted tokens extended plainly.
fn walk_distribution(
    shape: &Shape,
    p: &Dist,
    q_of: &dyn Fn(u64, &[u32]) -> Vec<f32>,
    len: usize,
) -> BTreeMap<Vec<u32>, f64> {
    let parents: Vec<u32> = shape.0.iter().map(|&(p, _)| p).collect();
    let mut got = BTreeMap::new();
    for (tokens, q_rows, w) in draws(shape, q_of) {
        let tree = DraftTree {
            tokens: &tokens,
            parents: &parents,
        };
        let mut p_rows = vec![p(&[])];
        for i in 0..tokens.len() {
            p_rows.push(p(&context_of(&shape.0, &tokens, i as u32)));
        }
        let pr: Vec<&[f32]> = p_rows.iter().map(Vec::as_slice).collect();
        let qd: Vec<DraftDist> = q_rows
            .iter()
            .map(|r| r.as_deref().map_or(DraftDist::PointMass, DraftDist::Full))
            .collect();
        let mut e = Enumerator::default();
        let (mut scratch, mut next) = (Vec::new(), Vec::new());
        loop {
            e.start();
            let o = accept_tree_sampled(&tree, &qd, &pr, &mut e, &mut scratch, &mut next).unwrap();
            let mut emitted: Vec<u32> = o.path.iter().map(|&n| tokens[n]).collect();
            emitted.push(o.next_token);
            emitted.truncate(len);
            extend_plainly(&emitted, len, w * e.weight, p, &mut got);
            if !e.next_path() {
                break;
            }
        }
    }
    got
}

fn assert_plain(got: &BTreeMap<Vec<u32>, f64>, p: &Dist, len: usize, what: &str) {
    let mut want = BTreeMap::new();
    extend_plainly(&[], len, 1.0, p, &mut want);
    let total: f64 = got.values().sum();
    assert!((total - 1.0).abs() < 1e-6, "{what}: mass {total}");
    for (seq, &w) in &want {
        let g = got.get(seq).copied().unwrap_or(0.0);
        assert!((g - w).abs() < 1e-6, "{what} {seq:?}: tree {g}, plain {w}");
    }
    assert!(
        got.keys().all(|k| want.contains_key(k)),
        "{what}: a sequence plain sampling never makes"
    );
}

#[test]
fn one_to_four_drafts_from_different_proposals_give_exactly_the_target_distribution() {
    let mut cases = 0;
    for k in 1..=4usize {
        for vocab in [3usize, 4, 5] {
            for (case, (p_kind, q_kind)) in [(0, 0), (1, 0), (0, 1), (2, 2), (1, 1)]
                .into_iter()
                .enumerate()
            {
                let seed = (k * 100 + vocab * 10 + case) as u64;
                let p = move |ctx: &[u32]| dist(seed, ctx, vocab, p_kind);
                // Each draft from a proposal of its own (the seed picks it).
                let q_of = move |s: u64, ctx: &[u32]| dist(s, ctx, vocab, q_kind);
                let shape = Shape(
                    (0..k)
                        .map(|i| (TREE_ROOT, Proposed::Drawn(seed ^ (0xD1 + i as u64))))
                        .collect(),
                );
                let got = walk_distribution(&shape, &p, &q_of, 2);
                assert_plain(&got, &p, 2, &format!("K={k} V={vocab} case {case}"));
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 60);
}

#[test]
fn a_drawn_draft_with_point_mass_alternatives_is_exact() {
    // The draft model's tree: its sampled token, then its next most likely ones as point masses.
    for vocab in [3usize, 4, 5] {
        for extra in 1..vocab {
            for (p_kind, q_kind) in [(0, 0), (1, 0), (2, 1)] {
                let seed = (vocab * 10 + extra) as u64 + 500;
                let p = move |ctx: &[u32]| dist(seed, ctx, vocab, p_kind);
                let q_of = move |s: u64, ctx: &[u32]| dist(s, ctx, vocab, q_kind);
                let mut nodes = vec![(TREE_ROOT, Proposed::Drawn(seed ^ 7))];
                nodes.extend((0..extra).map(|_| (TREE_ROOT, Proposed::Rank(seed ^ 7, 0))));
                let got = walk_distribution(&Shape(nodes), &p, &q_of, 2);
                assert_plain(&got, &p, 2, &format!("V={vocab} +{extra}"));
            }
        }
    }
}

#[test]
fn trees_two_levels_deep_are_exact() {
    for vocab in [3usize, 4] {
        for (case, (p_kind, q_kind)) in [(0, 0), (1, 1), (2, 0)].into_iter().enumerate() {
            let seed = (vocab * 10 + case) as u64 + 900;
            let p = move |ctx: &[u32]| dist(seed, ctx, vocab, p_kind);
            let q_of = move |s: u64, ctx: &[u32]| dist(s, ctx, vocab, q_kind);
            let qs = seed ^ 0x51;
            // 0: drawn; 1: the best other token; 2, 3: below 0 (drawn, then a point mass);
            // 4: below 1 (drawn); 5: below 2 (a point mass: three levels on that branch).
            let shape = Shape(vec![
                (TREE_ROOT, Proposed::Drawn(qs)),
                (TREE_ROOT, Proposed::Rank(qs, 0)),
                (0, Proposed::Drawn(qs)),
                (0, Proposed::Rank(qs, 0)),
                (1, Proposed::Drawn(qs)),
                (2, Proposed::Rank(qs, 1)),
            ]);
            let got = walk_distribution(&shape, &p, &q_of, 4);
            assert_plain(&got, &p, 4, &format!("V={vocab} case {case}"));
        }
    }
}

#[test]
fn a_walk_without_children_is_plain_sampling() {
    let p = |ctx: &[u32]| dist(3, ctx, 4, 0);
    let got = walk_distribution(&Shape(Vec::new()), &p, &|s, c| dist(s, c, 4, 0), 1);
    assert_plain(&got, &p, 1, "no drafts");
}

/// Greedy decoding of `p` from the root for `len` tokens.
fn greedy_decode(p: &Dist, len: usize) -> Vec<u32> {
    let mut out = Vec::new();
    while out.len() < len {
        out.push(argmax(&p(&out)).unwrap());
    }
    out
}

#[test]
fn a_greedy_walk_emits_the_longest_greedy_prefix_the_tree_holds() {
    let mut rng = crate::sampling::SeededRng::new(11);
    for case in 0..300u64 {
        let vocab = 3 + (case % 3) as usize;
        let p = move |ctx: &[u32]| dist(case, ctx, vocab, case % 3);
        let truth = greedy_decode(&p, 8);
        // A random tree of up to 7 nodes, some of them on the greedy path.
        let n = 1 + (rng.next_f64() * 7.0) as usize;
        let mut tokens: Vec<u32> = Vec::new();
        let mut parents: Vec<u32> = Vec::new();
        for _ in 0..n {
            let i = tokens.len();
            let parent = if i == 0 || rng.next_f64() < 0.3 {
                TREE_ROOT
            } else {
                (rng.next_f64() * i as f64) as u32
            };
            let above: Vec<usize> = if parent == TREE_ROOT {
                Vec::new()
            } else {
                DraftTree {
                    tokens: &tokens,
                    parents: &parents,
                }
                .path_to(parent as usize)
            };
            let depth = above.len();
            let on_path = above
                .iter()
                .enumerate()
                .all(|(d, &a)| tokens[a] == truth[d]);
            let token = if on_path && rng.next_f64() < 0.6 {
                truth[depth]
            } else {
                (rng.next_f64() * vocab as f64) as u32
            };
            // A prefix tree: siblings hold different tokens.
            let taken = (0..tokens.len()).any(|j| parents[j] == parent && tokens[j] == token);
            if !taken {
                tokens.push(token);
                parents.push(parent);
            }
        }
        let n = tokens.len();
        let tree = DraftTree {
            tokens: &tokens,
            parents: &parents,
        };
        let mut rows = vec![p(&[])];
        for i in 0..n {
            let ctx: Vec<u32> = tree.path_to(i).iter().map(|&a| tokens[a]).collect();
            rows.push(p(&ctx));
        }
        let pr: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let o = accept_tree_greedy(&tree, &pr).unwrap();
        let emitted: Vec<u32> = o
            .path
            .iter()
            .map(|&i| tokens[i])
            .chain([o.next_token])
            .collect();
        assert_eq!(emitted, truth[..emitted.len()], "case {case}");
        // No node extends the accepted path with the next greedy token.
        let longest = (0..n)
            .map(|i| tree.path_to(i))
            .filter(|path| path.iter().enumerate().all(|(d, &a)| tokens[a] == truth[d]))
            .map(|path| path.len())
            .max()
            .unwrap_or(0);
        assert_eq!(o.path.len(), longest, "case {case}");
        assert_eq!(
            o.bonus,
            tree.children(o.path.last().map_or(TREE_ROOT, |&l| l as u32))
                .count()
                == 0
        );
    }
}

#[test]
fn the_walk_reports_the_children_it_tried() {
    // Root children 0 (token 1) and 1 (token 2); node 0 has child 2 (token 0).
    let tokens = [1, 2, 0];
    let parents = [TREE_ROOT, TREE_ROOT, 0];
    let tree = DraftTree {
        tokens: &tokens,
        parents: &parents,
    };
    let row = |best: usize| {
        let mut r = vec![0.1f32; 3];
        r[best] = 0.8;
        r
    };
    // Greedy: the target wants 2 at the root (child 1 after child 0 is tried), then 1.
    let rows = [row(2), row(0), row(1), row(0)];
    let pr: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let o = accept_tree_greedy(&tree, &pr).unwrap();
    assert_eq!(o.path, vec![1]);
    assert_eq!(o.next_token, 1);
    assert_eq!(o.tried, vec![0, 1]);
    assert!(o.bonus, "node 1 has no children");
    // The target wants 1 then 0 then 1: child 0 is accepted first, child 1 never tried.
    let rows = [row(1), row(0), row(2), row(1)];
    let pr: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let o = accept_tree_greedy(&tree, &pr).unwrap();
    assert_eq!(o.path, vec![0, 2]);
    assert_eq!(o.next_token, 1);
    assert_eq!(o.tried, vec![0, 2]);
}

#[test]
fn bad_trees_and_rows_are_errors() {
    let r = [0.5f32, 0.5];
    // A parent that is not an earlier node.
    let tree = DraftTree {
        tokens: &[0, 1],
        parents: &[1, TREE_ROOT],
    };
    assert!(matches!(
        accept_tree_greedy(&tree, &[&r, &r, &r]),
        Err(SpecError::TreeOrder { node: 0, parent: 1 })
    ));
    let tree = DraftTree {
        tokens: &[0, 1],
        parents: &[TREE_ROOT, 0],
    };
    // One row short.
    assert!(matches!(
        accept_tree_greedy(&tree, &[&r, &r]),
        Err(SpecError::RowCount { .. })
    ));
    // A token outside the vocabulary.
    let bad = DraftTree {
        tokens: &[0, 5],
        parents: &[TREE_ROOT, 0],
    };
    assert!(matches!(
        accept_tree_greedy(&bad, &[&r, &r, &r]),
        Err(SpecError::DraftOutOfVocab { .. })
    ));
    // NaN in a sampled row; a q per node is required.
    let nan = [f32::NAN, 1.0];
    let mut rng = crate::sampling::SeededRng::new(1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let q = [DraftDist::PointMass, DraftDist::PointMass];
    assert!(matches!(
        accept_tree_sampled(&tree, &q, &[&r, &nan, &r], &mut rng, &mut a, &mut b),
        Err(SpecError::InvalidValue { .. })
    ));
    assert!(matches!(
        accept_tree_sampled(&tree, &q[..1], &[&r, &r, &r], &mut rng, &mut a, &mut b),
        Err(SpecError::RowCount { .. })
    ));
}
