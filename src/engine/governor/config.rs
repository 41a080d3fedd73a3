//! The governor's own settings (the γ range it chooses from is live, in the speculation
//! settings).

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
