//! Exact enumeration for the acceptance rules' tests: an implementation of [`RoundChoices`]
//! that follows every branch of a round's random choices with its probability, and the
//! context-dependent distributions, every draft chain and every outcome of a round with their
//! probabilities, and the plain-sampling reference the proofs compare against. Shared by the
//! chain rule's and the tree rule's tests and by drafting across vocabularies'
//! (`draft::translation`), so all are proven by one method.

use super::rejection::{accept_sampled_with, DraftDist, RoundChoices};
use super::Lenience;
use super::SeededRng;

/// Follows every branch of the round's random choices: each run of the round takes the choices
/// in `path` (extending it with the first branch where it runs out), multiplies their
/// probabilities into `weight`, and records how many branches each choice had, so that
/// [`Enumerator::next_path`] can step to the next combination.
#[derive(Default)]
pub(crate) struct Enumerator {
    path: Vec<usize>,
    branches: Vec<usize>,
    at: usize,
    pub(crate) weight: f64,
}

impl Enumerator {
    fn choose(&mut self, options: &[(usize, f64)]) -> usize {
        if self.at == self.path.len() {
            self.path.push(0);
            self.branches.push(options.len());
        }
        let (value, p) = options[self.path[self.at]];
        self.at += 1;
        self.weight *= p;
        value
    }

    /// Starts a run; false once every path has been taken.
    pub(crate) fn next_path(&mut self) -> bool {
        while let Some(last) = self.path.pop() {
            let n = self.branches.pop().expect("one count per choice");
            if last + 1 < n {
                self.path.push(last + 1);
                self.branches.push(n);
                return true;
            }
        }
        false
    }

    pub(crate) fn start(&mut self) {
        self.at = 0;
        self.weight = 1.0;
    }
}

impl RoundChoices for Enumerator {
    fn accept(&mut self, prob: f64) -> bool {
        let prob = prob.clamp(0.0, 1.0);
        let options: Vec<(usize, f64)> = [(1, prob), (0, 1.0 - prob)]
            .into_iter()
            .filter(|&(_, p)| p > 0.0)
            .collect();
        self.choose(&options) == 1
    }

    fn draw(&mut self, dist: &[f32]) -> u32 {
        let total: f64 = dist.iter().map(|&x| x as f64).sum();
        let options: Vec<(usize, f64)> = dist
            .iter()
            .enumerate()
            .filter(|&(_, &x)| x > 0.0)
            .map(|(i, &x)| (i, x as f64 / total))
            .collect();
        self.choose(&options) as u32
    }
}

/// A distribution over `vocab` tokens that depends on the context before it, deterministically:
/// `kind` 0 is dense, 1 has zeros, 2 puts almost all mass on one token.
pub(crate) fn dist(seed: u64, context: &[u32], vocab: usize, kind: u64) -> Vec<f32> {
    let mut h = seed;
    for &t in context {
        h = h
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(t as u64 + 1);
    }
    let mut rng = SeededRng::new(h);
    let mut w: Vec<f64> = (0..vocab).map(|_| rng.next_f64() + 0.01).collect();
    match kind {
        1 => {
            let keep = (rng.next_f64() * vocab as f64) as usize % vocab;
            for (i, x) in w.iter_mut().enumerate() {
                if i != keep && rng.next_f64() < 0.5 {
                    *x = 0.0;
                }
            }
        }
        2 => {
            let top = (rng.next_f64() * vocab as f64) as usize % vocab;
            for (i, x) in w.iter_mut().enumerate() {
                *x = if i == top { 1.0 } else { *x * 1e-3 };
            }
        }
        _ => {}
    }
    let sum: f64 = w.iter().sum();
    w.iter().map(|&x| (x / sum) as f32).collect()
}

/// Every sequence of `len` tokens with `weight(seq)`, plain sampling from `p` after `prefix`.
pub(crate) fn extend_plainly(
    prefix: &[u32],
    len: usize,
    weight: f64,
    p: &dyn Fn(&[u32]) -> Vec<f32>,
    out: &mut std::collections::BTreeMap<Vec<u32>, f64>,
) {
    if prefix.len() == len {
        *out.entry(prefix.to_vec()).or_default() += weight;
        return;
    }
    for (x, &px) in p(prefix).iter().enumerate() {
        if px > 0.0 {
            let mut next = prefix.to_vec();
            next.push(x as u32);
            extend_plainly(&next, len, weight * px as f64, p, out);
        }
    }
}

/// Every outcome of one exact round with its probability: `(emitted tokens, probability)`.
pub(crate) fn round_outcomes(
    drafts: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
) -> Vec<(Vec<u32>, f64)> {
    lenient_round_outcomes(drafts, q, p, 1.0)
}

/// Every outcome of one round at lenience `l`, by running [`accept_sampled_with`] down every
/// branch.
pub(crate) fn lenient_round_outcomes(
    drafts: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
    l: f32,
) -> Vec<(Vec<u32>, f64)> {
    let qd: Vec<DraftDist> = q.iter().map(|r| DraftDist::Full(r)).collect();
    outcomes_of(drafts, &qd, p, l)
}

/// Every outcome of one exact round whose drafts are point masses (deterministic proposals).
pub(crate) fn point_mass_round_outcomes(drafts: &[u32], p: &[Vec<f32>]) -> Vec<(Vec<u32>, f64)> {
    outcomes_of(drafts, &vec![DraftDist::PointMass; drafts.len()], p, 1.0)
}

fn outcomes_of(drafts: &[u32], qd: &[DraftDist], p: &[Vec<f32>], l: f32) -> Vec<(Vec<u32>, f64)> {
    let pr: Vec<&[f32]> = p.iter().map(Vec::as_slice).collect();
    let mut e = Enumerator::default();
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    loop {
        e.start();
        let o = accept_sampled_with(
            drafts,
            qd,
            &pr,
            Lenience::try_from(l).unwrap(),
            &mut e,
            &mut scratch,
        )
        .unwrap();
        let mut emitted = drafts[..o.accepted].to_vec();
        emitted.push(o.next_token);
        out.push((emitted, e.weight));
        if !e.next_path() {
            return out;
        }
    }
}

/// All draft sequences of `gamma` tokens, each drawn from q given the drafts before it, with
/// their probabilities.
pub(crate) fn draft_sequences(
    gamma: usize,
    q: &dyn Fn(&[u32]) -> Vec<f32>,
) -> Vec<(Vec<u32>, f64)> {
    let mut seqs = vec![(Vec::new(), 1.0)];
    for _ in 0..gamma {
        let mut next = Vec::new();
        for (s, w) in seqs {
            for (x, &qx) in q(&s).iter().enumerate() {
                if qx > 0.0 {
                    let mut t = s.clone();
                    t.push(x as u32);
                    next.push((t, w * qx as f64));
                }
            }
        }
        seqs = next;
    }
    seqs
}
