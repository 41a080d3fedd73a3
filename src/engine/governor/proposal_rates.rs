//! Which proposal a sampled request's drafter makes: its distribution's draws, or its likeliest
//! tokens as point masses.
//!
//! Why it exists: what a drafter's drafts keep under sampling depends on how it proposes, and
//! neither proposal is better everywhere. Each verified position measures both at once
//! (`ProposalEvidence`), so a request proposes whichever keeps more drafts
//! ([`ProposalRates::prefers_likeliest`]), starting from what requests at its temperature
//! measured (`PooledAcceptance`).

use crate::sampling::ProposalEvidence;

/// Pseudo-positions at the pooled means a request's proposal rates start with: its own
/// verified positions soon lead.
const PROPOSAL_PRIOR_WEIGHT: f64 = 2.0;

/// `prior` as a rate: clamped to [0, 1], one half if it is not a number.
pub(super) fn a_rate(prior: f64) -> f64 {
    if prior.is_finite() {
        prior.clamp(0.0, 1.0)
    } else {
        0.5
    }
}

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
            prior: a_rate(prior),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
