//! The speed governor (DESIGN.md §4): each round, choose how many tokens every request drafts.
//!
//! Why it exists: speculation only pays when the drafter agrees with the target often enough to
//! cover what drafting and a wider verification cost, and on a compute-bound CPU a γ+1-token
//! verification is far from free. The governor tracks the request's acceptance rate α (a
//! decaying average) and the measured costs of a draft step and of target forwards of each
//! width, picks the γ that maximises the expected speedup, and decodes plainly when no γ beats
//! plain decoding, probing again now and then so a request that becomes predictable gets
//! speculation back. Pure arithmetic: no clocks, no I/O; the caller feeds it measurements.

mod acceptance;
mod costs;
mod planner;
mod speedup;

pub use acceptance::{AcceptanceRate, Governor};
pub use costs::{CostEstimate, CostModel};
pub use planner::{
    expected_speedup, expected_tokens, forecast_round, plan_round, Candidate, Choice, RoundForecast,
};
pub use speedup::SpeedupEstimate;

/// Governor settings. The γ range it chooses from is live (`SpeculationSettings`), so it is
/// passed in each round instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorConfig {
    /// Weight of the past in the acceptance average, per drafted token (0.97 ≈ the last ~30
    /// drafts). Per token, not per round: decayed per round, a request drafting one token a
    /// round keeps so few observations that, with the prior, its estimate cannot approach full
    /// acceptance, which makes longer drafts look unprofitable and holds it at γ = 1.
    pub decay: f64,
    /// While decoding plainly, draft one probing round after this many steps; each probe that
    /// does not bring speculation back doubles the wait (up to 16 times this).
    pub probe_every: usize,
    /// Speculate only if the round's plan is expected to beat plain decoding by this factor:
    /// the margin for forecast error. Plans forecast a few percent faster beside a busy batch
    /// run slower in practice; a lone request's winning plans clear the margin easily.
    pub min_gain: f64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self {
            decay: 0.97,
            probe_every: 16,
            min_gain: 1.05,
        }
    }
}

/// Shared fixtures of the governor's tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn costs(draft: f64, verify: &[f64]) -> CostModel {
        let mut c = CostModel::new(verify.len());
        c.record_draft(draft * 3.0, 0.0, 3, 1);
        for (i, &v) in verify.iter().enumerate() {
            c.record_verify(v, i + 1);
        }
        c
    }

    /// The plan for one request alone, as its governor sees it.
    pub fn solo(g: &Governor, c: &CostModel) -> usize {
        plan_round(&[g.candidate(1, 8, 0, 1000)], 0, c, 1.02)[0]
    }
}
