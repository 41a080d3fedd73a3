//! One constrained round proven exact by enumeration, as the engine composes it
//! (`engine/scheduler/constrain.rs`): every target row masked by the grammar state after the
//! tokens before it; a sampled draft model's chain verified whole, forbidden tokens included;
//! a deterministic drafter's chain cut at its first forbidden token, and the grammar's forced
//! tokens (here: wherever the mask leaves one token) proposed as point-mass drafts in its
//! place. Either way the emitted sequences are distributed exactly as plain sampling from the
//! masked target.

use super::*;
use crate::sampling::enumeration::{dist, extend_plainly, Enumerator};

const VOCAB: usize = 4;

/// A grammar over 4 tokens that depends on the context: some positions allow one token only
/// (forced), others two or three, never none.
fn mask(ctx: &[u32]) -> Vec<bool> {
    let h = ctx
        .iter()
        .fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(t as u64 + 3));
    match h % 4 {
        0 => (0..VOCAB).map(|t| t == (h / 4) as usize % VOCAB).collect(),
        1 => (0..VOCAB).map(|t| t % 2 == (h / 4) as usize % 2).collect(),
        _ => (0..VOCAB).map(|t| t != (h / 4) as usize % VOCAB).collect(),
    }
}

/// The target's distribution masked and renormalised: what the logits pipeline gives a row
/// whose forbidden logits are -inf.
fn masked(p: Vec<f32>, ctx: &[u32]) -> Vec<f32> {
    let m = mask(ctx);
    let kept: Vec<f32> = p
        .iter()
        .zip(&m)
        .map(|(&x, &a)| if a { x } else { 0.0 })
        .collect();
    let sum: f32 = kept.iter().sum();
    if sum == 0.0 {
        // The target gave the allowed tokens no mass: uniform over them, as a softmax over
        // finite logits would never do; kept only so every row has mass.
        let n = m.iter().filter(|&&a| a).count() as f32;
        return m.iter().map(|&a| if a { 1.0 / n } else { 0.0 }).collect();
    }
    kept.iter().map(|&x| x / sum).collect()
}

/// The forced tokens after `ctx`: while the mask leaves one token, that token.
fn forced(ctx: &[u32], limit: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut c = ctx.to_vec();
    while out.len() < limit {
        let m = mask(&c);
        if m.iter().filter(|&&a| a).count() != 1 {
            break;
        }
        let t = m.iter().position(|&a| a).unwrap() as u32;
        out.push(t);
        c.push(t);
    }
    out
}

/// Every outcome of one round over `drafts` with draft rows `q` (`None`: point masses).
fn outcomes(
    ctx: &[u32],
    drafts: &[u32],
    q: Option<&[Vec<f32>]>,
    p: &dyn Fn(&[u32]) -> Vec<f32>,
) -> Vec<(Vec<u32>, f64)> {
    let p_rows: Vec<Vec<f32>> = (0..=drafts.len())
        .map(|i| {
            let mut c = ctx.to_vec();
            c.extend_from_slice(&drafts[..i]);
            p(&c)
        })
        .collect();
    let pr: Vec<&[f32]> = p_rows.iter().map(Vec::as_slice).collect();
    let qd: Vec<DraftDist> = match q {
        Some(q) => q.iter().map(|r| DraftDist::Full(r)).collect(),
        None => vec![DraftDist::PointMass; drafts.len()],
    };
    let mut e = Enumerator::default();
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    loop {
        e.start();
        let o = accept_sampled_with(drafts, &qd, &pr, Lenience::default(), &mut e, &mut scratch)
            .unwrap();
        let mut emitted = ctx.to_vec();
        emitted.extend_from_slice(&drafts[..o.accepted]);
        emitted.push(o.next_token);
        out.push((emitted, e.weight));
        if !e.next_path() {
            return out;
        }
    }
}

fn assert_same(
    got: &std::collections::BTreeMap<Vec<u32>, f64>,
    want: &std::collections::BTreeMap<Vec<u32>, f64>,
    what: &str,
) {
    let total: f64 = got.values().sum();
    assert!((total - 1.0).abs() < 1e-6, "{what}: mass {total}");
    for (seq, &w) in want {
        let g = got.get(seq).copied().unwrap_or(0.0);
        assert!((g - w).abs() < 1e-6, "{what} {seq:?}: round {g}, plain {w}");
    }
    assert!(
        got.keys().all(|k| want.contains_key(k)),
        "{what}: a sequence plain never makes"
    );
}

#[test]
fn a_masked_round_is_exact_for_sampled_and_deterministic_drafts_and_forced_tokens() {
    let mut forced_rounds = 0;
    for gamma in 1..=3usize {
        for (case, (p_kind, q_kind)) in [(0, 0), (1, 0), (2, 1), (0, 2)].into_iter().enumerate() {
            let seed = (gamma * 10 + case) as u64;
            let p = move |c: &[u32]| masked(dist(seed, c, VOCAB, p_kind), c);
            let q = move |c: &[u32]| dist(seed ^ 0x5EED, c, VOCAB, q_kind);
            // Two starting contexts, so forced and free positions both start rounds.
            for start in [vec![0u32], vec![1, 2]] {
                let len = start.len() + gamma + 1;
                let mut want = std::collections::BTreeMap::new();
                extend_plainly(&start, len, 1.0, &p, &mut want);

                // A sampled draft model: its chain drawn from its own unmasked q, verified whole.
                let mut got = std::collections::BTreeMap::new();
                let mut seqs = vec![(Vec::new(), 1.0f64)];
                for _ in 0..gamma {
                    let mut next = Vec::new();
                    for (s, w) in seqs {
                        let mut c = start.clone();
                        c.extend_from_slice(&s);
                        for (x, &qx) in q(&c).iter().enumerate() {
                            if qx > 0.0 {
                                let mut t: Vec<u32> = s.clone();
                                t.push(x as u32);
                                next.push((t, w * qx as f64));
                            }
                        }
                    }
                    seqs = next;
                }
                for (drafts, w) in seqs {
                    let q_rows: Vec<Vec<f32>> = (0..gamma)
                        .map(|i| {
                            let mut c = start.clone();
                            c.extend_from_slice(&drafts[..i]);
                            q(&c)
                        })
                        .collect();
                    for (emitted, pw) in outcomes(&start, &drafts, Some(&q_rows), &p) {
                        extend_plainly(&emitted, len, w * pw, &p, &mut got);
                    }
                }
                assert_same(&got, &want, &format!("sampled chain γ={gamma} case {case}"));

                // A deterministic drafter (q's most likely token at each step), cut at its
                // first forbidden token; forced tokens replace the chain where there are any.
                let mut chain = Vec::new();
                let mut c = start.clone();
                for _ in 0..gamma {
                    let row = q(&c);
                    let t = (0..VOCAB)
                        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                        .unwrap() as u32;
                    chain.push(t);
                    c.push(t);
                }
                let mut c = start.clone();
                let valid = chain
                    .iter()
                    .take_while(|&&t| {
                        let ok = mask(&c)[t as usize];
                        c.push(t);
                        ok
                    })
                    .count();
                chain.truncate(valid);
                let f = forced(&start, gamma);
                if !f.is_empty() {
                    chain = f;
                    forced_rounds += 1;
                }
                let mut got = std::collections::BTreeMap::new();
                for (emitted, pw) in outcomes(&start, &chain, None, &p) {
                    extend_plainly(&emitted, len.max(emitted.len()), pw, &p, &mut got);
                }
                // A round may emit past `len` (all drafts and the bonus): compare on `len`.
                let mut cut = std::collections::BTreeMap::new();
                for (s, w) in got {
                    *cut.entry(s[..len].to_vec()).or_insert(0.0) += w;
                }
                assert_same(&cut, &want, &format!("point masses γ={gamma} case {case}"));
            }
        }
    }
    assert!(forced_rounds > 0, "no round started at a forced position");
}
