//! Pricing a token tree's alternatives: which of the nodes a drafter offered beside its chain
//! are worth a row of the verification.
//!
//! Why it exists: on a CPU every verified token costs a fair share of a step, so a tree pays
//! only where its alternatives are accepted often enough to cover their rows. Each alternative
//! is worth the probability that the walk reaches and accepts it (one more token emitted), and
//! costs what one more row adds to the round's target forward. An alternative is kept when its
//! tokens per second beat the round's own, best first, so a tree can only make a round's
//! expected rate higher than its chain alone: trees are used only where they are forecast to
//! pay. Pure arithmetic over the governor's acceptance estimate, the measured forward prices
//! and [`ConfidenceRates`], learned from what the walks tried.
//!
//! The same pricing cuts a chain: with `confidence_pricing`, each drafted node's chance to
//! stand comes from the drafter's confidence in it (learned per kind of confidence), and the
//! chain ends where the next node is not worth its row ([`keep_chain`]). The governor plans γ
//! from the request's acceptance rate before drafting; this uses what the drafter knew about
//! each token it drafted, and can only make a round cheaper.

use super::costs::CostModel;
use crate::sampling::tree::TREE_ROOT;

/// How often a drafted node stands when the walk tries it, by the drafter's confidence in it
/// (ten buckets of width 0.1) and the kind of that confidence (`Proposal::confidence_kind`:
/// a draft model's probability, or prompt lookup's agreement after a 1-, 2- or 3-token
/// match), learned from verified rounds and decayed, starting from the confidence itself as
/// a prior. The scheduler keeps one for chains' nodes and one for trees' alternatives.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ConfidenceRates {
    tried: [[f64; BUCKETS]; KINDS],
    accepted: [[f64; BUCKETS]; KINDS],
}

const BUCKETS: usize = 10;
const KINDS: usize = 4;

/// The prior's weight in tries: a few rounds' evidence moves an estimate.
const PRIOR_TRIES: f64 = 4.0;

/// Weight of the past per recorded try (≈ the last few hundred tries per bucket).
const DECAY: f64 = 0.995;

impl Default for ConfidenceRates {
    fn default() -> Self {
        Self {
            tried: [[0.0; BUCKETS]; KINDS],
            accepted: [[0.0; BUCKETS]; KINDS],
        }
    }
}

fn cell(kind: u8, confidence: f32) -> (usize, usize) {
    let b = ((confidence.clamp(0.0, 1.0) * BUCKETS as f32) as usize).min(BUCKETS - 1);
    ((kind as usize).min(KINDS - 1), b)
}

impl ConfidenceRates {
    /// A node of this kind and confidence was tried, and stood or not.
    pub fn record(&mut self, kind: u8, confidence: f32, accepted: bool) {
        let (k, b) = cell(kind, confidence);
        self.tried[k][b] = DECAY * self.tried[k][b] + 1.0;
        self.accepted[k][b] = DECAY * self.accepted[k][b] + f64::from(u8::from(accepted));
    }

    /// The estimated chance a node of this kind and confidence stands when tried.
    pub fn rate(&self, kind: u8, confidence: f32) -> f64 {
        let (k, b) = cell(kind, confidence);
        let prior = f64::from(confidence.clamp(0.0, 1.0));
        (self.accepted[k][b] + PRIOR_TRIES * prior) / (self.tried[k][b] + PRIOR_TRIES)
    }
}

/// A round before its trees' alternatives: expected tokens, seconds, and the width of its
/// target forward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundPrice {
    pub tokens: f64,
    pub seconds: f64,
    pub width: usize,
}

/// One tree as the pricing sees it: its shape (the first `chain_len` nodes are the chain),
/// the drafter's confidence per node and its kind, and how likely each chain node is to stand
/// when tried (the sequence's α, or the chain's learned rates by confidence).
#[derive(Clone, Copy, Debug)]
pub struct TreeOffer<'a> {
    pub parents: &'a [u32],
    pub chain_len: usize,
    pub confidence: &'a [f32],
    pub kind: u8,
    pub chain_accept: &'a [f64],
}

/// The probability that the walk accepts each node: the chain's node `i` with the product of
/// its and its predecessors' rates; an alternative with the probability its parent is
/// accepted (1 for the root), times that every sibling before it was rejected (the chain's with
/// one minus its rate, an alternative's with one minus its learned rate), times its own rate.
pub fn acceptance_by_node(offer: &TreeOffer, rates: &ConfidenceRates) -> Vec<f64> {
    let n = offer.parents.len();
    let own = |i: usize| {
        if i < offer.chain_len {
            offer
                .chain_accept
                .get(i)
                .copied()
                .unwrap_or(0.0)
                .clamp(0.0, 1.0)
        } else {
            rates.rate(offer.kind, offer.confidence.get(i).copied().unwrap_or(0.0))
        }
    };
    let mut accept = vec![0.0; n];
    for i in 0..n {
        let parent = offer.parents[i];
        let reach = if parent == TREE_ROOT {
            1.0
        } else {
            accept[parent as usize]
        };
        let tried: f64 = (0..i)
            .filter(|&j| offer.parents[j] == parent)
            .map(|j| 1.0 - own(j))
            .product();
        accept[i] = reach * tried * own(i);
    }
    accept
}

/// How many of a chain's nodes to verify, given each node's chance to stand when tried
/// (`accept`, in order): node `i` is kept while the tokens it is expected to add (the product
/// of the rates up to it) per second of the row it costs beat the round's rate so far, and
/// always the first `min`. The round's price is updated with what is kept. `None` when forward
/// prices are not measured yet (keep the chain).
pub fn keep_chain(
    accept: &[f64],
    min: usize,
    round: &mut RoundPrice,
    costs: &CostModel,
) -> Option<usize> {
    let mut reach = 1.0;
    let mut kept = 0;
    for (i, &a) in accept.iter().enumerate() {
        reach *= a.clamp(0.0, 1.0);
        let row =
            (costs.verify_seconds(round.width + 1)? - costs.verify_seconds(round.width)?).max(0.0);
        if i >= min && reach * round.seconds <= round.tokens * row {
            break;
        }
        kept += 1;
        round.tokens += reach;
        round.seconds += row;
        round.width += 1;
    }
    Some(kept)
}

/// Which nodes of the tree to verify: the chain always; alternatives likeliest first, each
/// while the tokens it is expected to add per second of the row it costs beat the round's
/// rate so far (`round`, updated as nodes are added). `None` when forward prices are not
/// measured yet (keep the chain only).
pub fn keep_alternatives(
    offer: &TreeOffer,
    rates: &ConfidenceRates,
    round: &mut RoundPrice,
    costs: &CostModel,
) -> Option<Vec<bool>> {
    let n = offer.parents.len();
    let accept = acceptance_by_node(offer, rates);
    let mut keep: Vec<bool> = (0..n).map(|i| i < offer.chain_len).collect();
    let mut order: Vec<usize> = (offer.chain_len..n).collect();
    order.sort_by(|&a, &b| accept[b].total_cmp(&accept[a]).then(a.cmp(&b)));
    for i in order {
        let parent = offer.parents[i];
        if parent != TREE_ROOT && !keep[parent as usize] {
            continue;
        }
        let row = costs.verify_seconds(round.width + 1)? - costs.verify_seconds(round.width)?;
        let row = row.max(0.0);
        if round.seconds <= 0.0 || accept[i] * round.seconds <= round.tokens * row {
            continue;
        }
        keep[i] = true;
        round.tokens += accept[i];
        round.seconds += row;
        round.width += 1;
    }
    Some(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(step: f64, row: f64) -> CostModel {
        let mut c = CostModel::new(16);
        for w in 1..=16 {
            c.record_verify(step + row * (w - 1) as f64, w);
        }
        c
    }

    #[test]
    fn rates_start_at_the_confidence_and_follow_what_the_walks_saw() {
        let mut r = ConfidenceRates::default();
        assert!((r.rate(1, 0.35) - 0.35).abs() < 1e-6);
        for _ in 0..200 {
            r.record(1, 0.35, false);
        }
        assert!(r.rate(1, 0.35) < 0.05, "{}", r.rate(1, 0.35));
        // Another bucket, and another kind, are untouched.
        assert!((r.rate(1, 0.75) - 0.75).abs() < 1e-6);
        assert!((r.rate(2, 0.35) - 0.35).abs() < 1e-6);
        for _ in 0..200 {
            r.record(1, 0.38, true);
        }
        assert!(r.rate(1, 0.31) > 0.4, "the bucket learned both");
    }

    #[test]
    fn a_chain_is_cut_where_its_next_node_does_not_pay() {
        // A 1 ms step, 0.3 ms a row, 0.5 ms of drafting; a lone request (1 sure token).
        let c = costs(0.001, 0.0003);
        let round = || RoundPrice {
            tokens: 1.0,
            seconds: 0.0015,
            width: 1,
        };
        // Rates 0.9, 0.9, 0.3, 0.9: reaches 0.9, 0.81, 0.243 (0.243 per 0.3 ms is below the
        // round's ~1000 tokens/s by then).
        let mut r = round();
        assert_eq!(keep_chain(&[0.9, 0.9, 0.3, 0.9], 0, &mut r, &c), Some(2));
        assert_eq!(r.width, 3);
        assert!((r.tokens - 2.71).abs() < 1e-9);
        // A floor of 3 keeps the third anyway; nothing unsure keeps everything.
        assert_eq!(
            keep_chain(&[0.9, 0.9, 0.3, 0.9], 3, &mut round(), &c),
            Some(3)
        );
        assert_eq!(keep_chain(&[1.0; 4], 0, &mut round(), &c), Some(4));
        // A first node unlikely to stand is not worth a row: a plain step.
        assert_eq!(keep_chain(&[0.1, 0.9], 0, &mut round(), &c), Some(0));
        assert_eq!(keep_chain(&[0.1], 0, &mut r, &CostModel::new(4)), None);
    }

    #[test]
    fn acceptance_follows_the_walk() {
        // Chain 0 → 1, alternative 2 beside 0, alternative 3 under 2, alternative 4 beside 2.
        let parents = [TREE_ROOT, 0, TREE_ROOT, 2, TREE_ROOT];
        let conf = [1.0, 1.0, 0.5, 0.5, 0.25];
        let offer = TreeOffer {
            parents: &parents,
            chain_len: 2,
            confidence: &conf,
            kind: 0,
            chain_accept: &[0.6, 0.6],
        };
        let a = acceptance_by_node(&offer, &ConfidenceRates::default());
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(a[0], 0.6) && close(a[1], 0.36));
        assert!(close(a[2], 0.4 * 0.5), "{}", a[2]);
        assert!(close(a[3], 0.2 * 0.5));
        assert!(close(a[4], 0.4 * 0.5 * 0.25));
    }

    #[test]
    fn alternatives_are_kept_only_while_they_beat_the_round() {
        let parents = [TREE_ROOT, 0, TREE_ROOT, 2, TREE_ROOT];
        let conf = [1.0, 1.0, 0.5, 0.5, 0.25];
        let offer = TreeOffer {
            parents: &parents,
            chain_len: 2,
            confidence: &conf,
            kind: 0,
            chain_accept: &[0.6, 0.6],
        };
        let rates = ConfidenceRates::default();
        // A round of 1.96 tokens over a 3-wide forward (1 ms + 0.3 ms a row) and 0.5 ms of
        // drafting: 2.1 ms, 933 tokens/s. Alternative 2 (0.2 tokens for 0.3 ms: 667/s) does
        // not pay.
        let c = costs(0.001, 0.0003);
        let mut round = RoundPrice {
            tokens: 1.96,
            seconds: 0.0021,
            width: 3,
        };
        let keep = keep_alternatives(&offer, &rates, &mut round, &c).unwrap();
        assert_eq!(keep, [true, true, false, false, false]);
        // Rows ten times cheaper: 2 (0.2 per 0.03 ms) and 3 (0.1) pay, 4 (0.05 per 0.03 ms,
        // 1667/s against the round's ~1000/s) too.
        let c = costs(0.001, 0.00003);
        let mut round = RoundPrice {
            tokens: 1.96,
            seconds: 0.0021,
            width: 3,
        };
        let keep = keep_alternatives(&offer, &rates, &mut round, &c).unwrap();
        assert_eq!(keep, [true; 5]);
        assert_eq!(round.width, 6);
        assert!((round.tokens - (1.96 + 0.2 + 0.1 + 0.05)).abs() < 1e-9);
        // A child is never kept without its parent: with alternative 2 unlikely, 3 goes too.
        let conf = [1.0, 1.0, 0.01, 0.9, 0.25];
        let offer = TreeOffer {
            confidence: &conf,
            ..offer
        };
        let mut round = RoundPrice {
            tokens: 1.96,
            seconds: 0.0021,
            width: 3,
        };
        let keep = keep_alternatives(&offer, &rates, &mut round, &costs(0.001, 0.00003)).unwrap();
        assert!(!keep[2] && !keep[3] && keep[4], "{keep:?}");
        // Unmeasured prices: the chain only.
        let mut round = RoundPrice {
            tokens: 1.0,
            seconds: 0.001,
            width: 1,
        };
        assert!(keep_alternatives(&offer, &rates, &mut round, &CostModel::new(4)).is_none());
    }
}
