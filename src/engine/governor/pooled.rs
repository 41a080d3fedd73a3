//! Acceptance pooled across requests by temperature class: where a new request's governor
//! starts.
//!
//! Why it exists: sampling keeps fewer drafts than greedy decoding, and fewer the hotter it
//! samples, so a greedy request's acceptance says little about one at T = 0.8. A new request
//! starts from the recent acceptance of requests in its own class, kind by kind, and from the
//! proposal its class's sampled drafts stood best with.

use super::governor_state::{KindRates, PooledClass};
use super::proposal_rates::ProposalRates;
use super::text_coverage::PooledCoverage;
use crate::sampling::SamplingParams;

/// The temperatures that bound the classes of [`PooledAcceptance`] above greedy: a class holds
/// the temperatures below its bound (the last, every one above).
const TEMPERATURE_BOUNDS: [f32; 2] = [0.6, 1.0];
/// Greedy, then one class per bound, then the rest.
pub const TEMPERATURE_CLASSES: usize = TEMPERATURE_BOUNDS.len() + 2;

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
                coverage: PooledCoverage::default(),
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
