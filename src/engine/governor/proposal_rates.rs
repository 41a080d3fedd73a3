//! Which proposal a sampled request's drafter makes (its distribution's draws, or its likeliest
//! tokens as point masses), and acceptance pooled across requests by temperature.
//!
//! Why it exists: what a drafter's drafts keep under sampling depends on the temperature and on
//! how the drafter proposes. A greedy request's acceptance says little about one at T = 0.8,
//! so a new request starts from the recent acceptance of requests in its own temperature class
//! ([`PooledAcceptance`]). And each verified position measures both proposals at once
//! (`ProposalEvidence`), so a request proposes whichever keeps more drafts
//! ([`ProposalRates::prefers_likeliest`]), starting from what its class measured.

use super::governor_state::KindRates;
use crate::sampling::{ProposalEvidence, SamplingParams};

/// Pseudo-positions at the pooled means a request's proposal rates start with: its own
/// verified positions soon lead.
const PROPOSAL_PRIOR_WEIGHT: f64 = 2.0;

/// A decayed mean of per-position probabilities, starting at a prior worth
/// [`PROPOSAL_PRIOR_WEIGHT`] positions.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct DecayedMean {
    sum: f64,
    weight: f64,
    prior: f64,
}

impl DecayedMean {
    fn new(prior: f64) -> Self {
        Self {
            sum: 0.0,
            weight: 0.0,
            prior: if prior.is_finite() {
                prior.clamp(0.0, 1.0)
            } else {
                0.5
            },
        }
    }

    fn get(&self) -> f64 {
        (self.sum + PROPOSAL_PRIOR_WEIGHT * self.prior) / (self.weight + PROPOSAL_PRIOR_WEIGHT)
    }

    fn record(&mut self, sum: f64, rows: u32, decay: f64) {
        if rows == 0 {
            return;
        }
        let d = decay.powi(rows as i32);
        self.sum = d * self.sum + sum;
        self.weight = d * self.weight + f64::from(rows);
    }
}

/// How often a drawn draft and the drafter's likeliest token would stand, per verified
/// position, decayed per position.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProposalRates {
    sampled: DecayedMean,
    likeliest: DecayedMean,
}

impl Default for ProposalRates {
    fn default() -> Self {
        Self {
            sampled: DecayedMean::new(0.5),
            likeliest: DecayedMean::new(0.5),
        }
    }
}

impl ProposalRates {
    /// A request's rates, starting where `pooled` stands.
    pub fn starting_from(pooled: &ProposalRates) -> Self {
        Self {
            sampled: DecayedMean::new(pooled.sampled.get()),
            likeliest: DecayedMean::new(pooled.likeliest.get()),
        }
    }

    /// A round's evidence; the past weighs `decay` per position.
    pub fn record(&mut self, e: &ProposalEvidence, decay: f64) {
        self.sampled.record(e.sampled, e.sampled_rows, decay);
        self.likeliest.record(e.likeliest, e.rows, decay);
    }

    /// Whether proposing the likeliest tokens keeps more drafts than drawing them. Equal (no
    /// evidence yet): drawing, the proposal that measures both.
    pub fn prefers_likeliest(&self) -> bool {
        self.likeliest.get() > self.sampled.get()
    }

    /// (drawn, likeliest): how often each would stand.
    pub fn rates(&self) -> (f64, f64) {
        (self.sampled.get(), self.likeliest.get())
    }
}

/// The temperatures that bound the classes of [`PooledAcceptance`] above greedy: a class holds
/// the temperatures below its bound (the last, every one above).
const TEMPERATURE_BOUNDS: [f32; 2] = [0.6, 1.0];
/// Greedy, then one class per bound, then the rest.
pub const TEMPERATURE_CLASSES: usize = TEMPERATURE_BOUNDS.len() + 2;

/// What every request of one temperature class drafted lately.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PooledClass {
    /// Acceptance by kind of draft: where a new request's governor starts.
    pub rates: KindRates,
    /// Where a new request's choice of proposal starts (sampled classes).
    pub proposals: ProposalRates,
}

/// Acceptance pooled across requests, kept apart by temperature class: greedy, below 0.6,
/// below 1, and 1 or more. At T = 0.8 prompt lookup's copies stood 50% of the time where
/// greedy ones stood 81% (Gemma-3-270M); pooled together, a sampled request would start on
/// greedy's hope and pay for it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PooledAcceptance {
    classes: [PooledClass; TEMPERATURE_CLASSES],
}

impl PooledAcceptance {
    /// Every class at `prior`, with no evidence.
    pub fn new(prior: f64) -> Self {
        Self {
            classes: [PooledClass {
                rates: KindRates::new(prior),
                proposals: ProposalRates::default(),
            }; TEMPERATURE_CLASSES],
        }
    }

    /// The class of requests sampled with `params`.
    pub fn class(&self, params: &SamplingParams) -> &PooledClass {
        &self.classes[class_of(params)]
    }

    pub fn class_mut(&mut self, params: &SamplingParams) -> &mut PooledClass {
        &mut self.classes[class_of(params)]
    }
}

fn class_of(params: &SamplingParams) -> usize {
    if params.is_greedy() {
        return 0;
    }
    1 + TEMPERATURE_BOUNDS
        .iter()
        .take_while(|&&b| params.temperature >= b)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    fn evidence(rows: u32, sampled: f64, likeliest: f64) -> ProposalEvidence {
        ProposalEvidence {
            rows,
            sampled: sampled * f64::from(rows),
            sampled_rows: rows,
            likeliest: likeliest * f64::from(rows),
        }
    }

    #[test]
    fn a_request_proposes_what_its_positions_say_keeps_more() {
        let mut r = ProposalRates::default();
        assert!(!r.prefers_likeliest(), "draws first: they measure both");
        r.record(&evidence(6, 0.4, 0.7), 0.97);
        assert!(r.prefers_likeliest());
        // Proposing the likeliest alone measures only it; when it falls below what draws
        // kept, draws come back.
        r.record(
            &ProposalEvidence {
                rows: 30,
                likeliest: 0.1 * 30.0,
                ..Default::default()
            },
            0.97,
        );
        assert!(!r.prefers_likeliest(), "{:?}", r.rates());
    }

    #[test]
    fn a_new_request_starts_from_its_class_and_soon_follows_its_own_positions() {
        let mut pooled = ProposalRates::default();
        pooled.record(&evidence(100, 0.3, 0.8), 0.995);
        let mut r = ProposalRates::starting_from(&pooled);
        assert!(r.prefers_likeliest());
        r.record(&evidence(8, 0.9, 0.5), 0.97);
        assert!(!r.prefers_likeliest(), "{:?}", r.rates());
    }

    #[test]
    fn temperatures_fall_in_their_classes() {
        let mut p = PooledAcceptance::new(0.5);
        p.class_mut(&at(0.8)).rates.record(1, 4, 0, 0.995);
        assert!(p.class(&at(0.7)).rates.get(Some(1)) < 0.5);
        for t in [0.0, 0.3, 1.0, 1.5] {
            assert_eq!(p.class(&at(t)).rates.get(Some(1)), 0.5, "T = {t}");
        }
        assert_eq!(class_of(&SamplingParams::greedy()), 0);
        assert_eq!(
            [0.3, 0.6, 0.99, 1.0, 2.0].map(|t| class_of(&at(t))),
            [1, 2, 2, 3, 3]
        );
    }
}
