//! What the governor learned that is worth keeping past a restart: the prices of this
//! machine's forwards, draft steps and catch-ups, and how often each kind of draft stood.
//!
//! Why it exists: a fresh process otherwise pays full calibration before its first request
//! and plans that request's first rounds on a pooled hope (every kind of draft at one half),
//! which a short request never earns back. Kept in the cache directory by the engine (under a
//! key naming the model files, the machine and the settings) and checked against a few timed
//! forwards before it is trusted. Pure data: the engine reads and writes it.

use serde::{Deserialize, Serialize};

use super::branches::ConfidenceRates;
use super::costs::CostModel;
use super::pooled::PooledAcceptance;

/// A remembered price table is trusted when each check forward timed at start-up took within
/// this factor of what it took when the table was measured, either way. A fresh process's
/// best of three still moves by up to 1.3x between runs on a shared 2-core VM (1.25 failed
/// about one check in three there); a machine twice as busy, or one half as fast, does not
/// pass. Another machine kind never gets here: its file is another.
pub const PRICE_TOLERANCE: f64 = 1.5;

/// The governor's learning, as saved and restored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Remembered {
    pub costs: CostModel,
    /// The check's forwards (width, best seconds) as timed right after `costs` was measured:
    /// a later start times the same forwards the same way and trusts `costs` only if they
    /// still run at these.
    pub reference: Vec<(usize, f64)>,
    /// Every request's drafts together, by temperature class and kind: where a new request's
    /// governor starts.
    pub acceptance: PooledAcceptance,
    pub chain_rates: ConfidenceRates,
    pub branch_rates: ConfidenceRates,
}

/// Whether a remembered table still holds: every check forward timed `now` took within
/// [`PRICE_TOLERANCE`] of what it took `then`, right after the table was measured, either way.
/// The same forwards timed the same way are compared, not the table's own prices: those come
/// from back-to-back decoding, which start-up cannot reproduce (a fresh process's steps run
/// 1.2-1.8x a decoding loop's).
pub fn still_holds(then: &[(usize, f64)], now: &[(usize, f64)]) -> bool {
    !then.is_empty()
        && then.len() == now.len()
        && then.iter().zip(now).all(|(&(w0, t0), &(w1, t1))| {
            w0 == w1 && t0 > 0.0 && t1 <= t0 * PRICE_TOLERANCE && t1 * PRICE_TOLERANCE >= t0
        })
}

/// The forwards timed to check a remembered table: a step and the widest lone verification,
/// the two ends of what a lone request's plans compare.
pub fn check_widths(gamma_limit: usize) -> Vec<usize> {
    vec![1, gamma_limit + 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> CostModel {
        let mut c = CostModel::new(9);
        for w in 1..=9 {
            c.record_forward(0.002 + 0.0002 * w as f64, &[(w, 0)], &[]);
        }
        c.record_draft(0.003, (0.001, 1), 3, 1);
        c.record_catch_up(0.02, 40);
        c
    }

    #[test]
    fn a_table_survives_saving_and_restoring_with_its_prices() {
        let mut acceptance = PooledAcceptance::new(0.5);
        let sampled = crate::sampling::SamplingParams {
            temperature: 0.8,
            ..Default::default()
        };
        let class = acceptance.class_mut(&sampled);
        class.rates.record(1, 4, 0, 0.995);
        class.coverage.record(0.6, 4, 0.995);
        class.proposals.record(
            &crate::sampling::ProposalEvidence {
                rows: 5,
                sampled: 1.0,
                sampled_rows: 5,
                likeliest: 4.0,
            },
            0.995,
        );
        let r = Remembered {
            costs: table(),
            reference: vec![(1, 0.002), (9, 0.004)],
            acceptance,
            chain_rates: ConfidenceRates::default(),
            branch_rates: ConfidenceRates::default(),
        };
        let text = serde_json::to_string(&r).unwrap();
        let back: Remembered = serde_json::from_str(&text).unwrap();
        for w in 1..=12 {
            assert_eq!(
                back.costs.verify_seconds(w),
                r.costs.verify_seconds(w),
                "{w}"
            );
        }
        assert_eq!(back.costs.draft_seconds(3, 1), r.costs.draft_seconds(3, 1));
        assert_eq!(
            back.costs.catch_up_seconds(100),
            r.costs.catch_up_seconds(100)
        );
        assert_eq!(back.acceptance, r.acceptance);
        assert_eq!(back.reference, r.reference);
        assert!(back.acceptance.class(&sampled).coverage.mean(1.0) < 0.9);
        // A table kept before prompt coverage was: its classes start with none recorded.
        let older = text.replace(r#","coverage":{"covered":2.4,"drafts":4.0}"#, "");
        assert_ne!(older, text);
        let back: Remembered = serde_json::from_str(&older).unwrap();
        assert_eq!(back.acceptance.class(&sampled).coverage.mean(1.0), 1.0);
        assert!(
            back.acceptance.class(&sampled).rates.get(Some(1)) < 0.5,
            "a kind's own rate is kept, in its temperature class"
        );
        assert!(back
            .acceptance
            .class(&sampled)
            .proposals
            .prefers_likeliest());
        let greedy = crate::sampling::SamplingParams::greedy();
        assert_eq!(back.acceptance.class(&greedy).rates.get(Some(1)), 0.5);
        assert!(!back.costs.is_frozen());
    }

    #[test]
    fn a_table_holds_only_while_its_check_forwards_run_as_they_did() {
        let then = [(1, 0.004), (9, 0.008)];
        assert!(still_holds(&then, &[(1, 0.0052), (9, 0.0062)]));
        assert!(
            !still_holds(&then, &[(1, 0.0064), (9, 0.008)]),
            "a slower machine"
        );
        assert!(
            !still_holds(&then, &[(1, 0.004), (9, 0.005)]),
            "a faster one"
        );
        assert!(!still_holds(&then, &[(1, 0.004)]), "not the same forwards");
        assert!(
            !still_holds(&then, &[(1, 0.004), (5, 0.008)]),
            "another width"
        );
        assert!(!still_holds(&[], &[]), "nothing to compare");
        assert!(
            !still_holds(&[(1, 0.0)], &[(1, 0.0)]),
            "a zero time proves nothing"
        );
    }
}
