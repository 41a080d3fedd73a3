//! The speed governor (DESIGN.md §4): per request, choose how many tokens to draft.
//!
//! Why it exists: speculation only pays when the drafter agrees with the target often enough to
//! cover what drafting and a wider verification cost, and on a compute-bound CPU a γ+1-token
//! verification is far from free. The governor tracks the request's acceptance rate α (a
//! decaying average) and the measured costs of a draft step and of target forwards of each
//! width, picks the γ that maximises the expected speedup, and decodes plainly when no γ beats
//! plain decoding, probing again now and then so a request that becomes predictable gets
//! speculation back. Pure arithmetic: no clocks, no I/O; the caller feeds it measurements.

/// Governor settings. The γ range it chooses from is live (`SpeculationSettings`), so it is
/// passed to `choose` each round instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorConfig {
    /// Weight of the past in the acceptance average, per round (0.9 ≈ the last ~10 rounds).
    pub decay: f64,
    /// While decoding plainly, draft one probing round every this many steps.
    pub probe_every: usize,
    /// Speculate only if the best γ is expected to beat plain decoding by this factor.
    pub min_gain: f64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self {
            decay: 0.9,
            probe_every: 16,
            min_gain: 1.02,
        }
    }
}

/// A decaying average of a measured cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct CostAverage {
    value: Option<f64>,
}

impl CostAverage {
    const DECAY: f64 = 0.8;

    pub fn record(&mut self, seconds: f64) {
        self.value = Some(match self.value {
            Some(v) => Self::DECAY * v + (1.0 - Self::DECAY) * seconds,
            None => seconds,
        });
    }

    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// Measured costs: one draft step, and target forwards by width (tokens per sequence).
#[derive(Clone, Debug)]
pub struct CostModel {
    draft_step: CostAverage,
    /// `verify[w - 1]`: a target forward of `w` new tokens.
    verify: Vec<CostAverage>,
}

impl CostModel {
    pub fn new(gamma_max: usize) -> Self {
        Self {
            draft_step: CostAverage::default(),
            verify: vec![CostAverage::default(); gamma_max + 1],
        }
    }

    /// Time spent drafting `tokens` tokens (one draft step each).
    pub fn record_draft(&mut self, seconds: f64, tokens: usize) {
        if tokens > 0 {
            self.draft_step.record(seconds / tokens as f64);
        }
    }

    /// Time of a target forward of `width` new tokens.
    pub fn record_verify(&mut self, seconds: f64, width: usize) {
        if let Some(c) = width.checked_sub(1).and_then(|i| self.verify.get_mut(i)) {
            c.record(seconds);
        }
    }

    /// Cost of a round of γ relative to one plain step; unknown widths are interpolated
    /// linearly from the nearest measured ones (or assumed to cost one step per token until
    /// anything is measured, the pessimistic guess).
    pub fn round_cost(&self, gamma: usize) -> Option<f64> {
        let plain = self.verify[0].get()?;
        let draft = self.draft_step.get()?;
        let verify = self
            .verify_cost(gamma + 1)
            .unwrap_or(plain * (gamma + 1) as f64);
        Some((gamma as f64 * draft + verify) / plain)
    }

    fn verify_cost(&self, width: usize) -> Option<f64> {
        if let Some(v) = self.verify.get(width - 1).and_then(CostAverage::get) {
            return Some(v);
        }
        let below = (1..width)
            .rev()
            .find_map(|w| self.verify[w - 1].get().map(|c| (w, c)))?;
        let above =
            (width + 1..=self.verify.len()).find_map(|w| self.verify[w - 1].get().map(|c| (w, c)));
        Some(match above {
            Some((wa, ca)) => {
                let t = (width - below.0) as f64 / (wa - below.0) as f64;
                below.1 + t * (ca - below.1)
            }
            // Past the widest measured forward: each extra token costs what the last one did
            // on average, never less than nothing.
            None => below.1 * width as f64 / below.0 as f64,
        })
    }
}

/// The expected speedup of drafting γ with acceptance rate α and a round costing `round_cost`
/// plain steps: expected tokens per round `(1 − α^(γ+1)) / (1 − α)` over the round's cost.
pub fn expected_speedup(alpha: f64, gamma: usize, round_cost: f64) -> f64 {
    let tokens = if alpha >= 1.0 {
        (gamma + 1) as f64
    } else {
        (1.0 - alpha.powi(gamma as i32 + 1)) / (1.0 - alpha)
    };
    tokens / round_cost
}

/// One request's governor.
#[derive(Clone, Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    /// Decayed counts of accepted and rejected drafts.
    accepted: f64,
    rejected: f64,
    plain_steps: usize,
}

impl Governor {
    pub fn new(cfg: GovernorConfig) -> Self {
        Self {
            cfg,
            accepted: 0.0,
            rejected: 0.0,
            plain_steps: 0,
        }
    }

    /// The acceptance rate estimate: accepted / (accepted + rejected) over recent rounds, with
    /// one pseudo-observation each way so a first round does not decide everything.
    pub fn alpha(&self) -> f64 {
        (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)
    }

    /// Records a round: `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection).
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.plain_steps += 1;
            return;
        }
        self.plain_steps = 0;
        let d = self.cfg.decay;
        self.accepted = d * self.accepted + accepted as f64;
        self.rejected = d * self.rejected + f64::from(u8::from(accepted < drafted));
    }

    /// γ in `gamma_min..=gamma_max` for the next round (0 = a plain step), given the measured
    /// costs.
    pub fn choose(&self, costs: &CostModel, gamma_min: usize, gamma_max: usize) -> usize {
        let alpha = self.alpha();
        let gamma_min = gamma_min.max(1);
        let mut best = (0usize, 1.0f64);
        for gamma in gamma_min..=gamma_max {
            // Until costs are measured, speculate with the smallest γ to measure them.
            let Some(cost) = costs.round_cost(gamma) else {
                return gamma_min;
            };
            let s = expected_speedup(alpha, gamma, cost);
            if s > best.1 {
                best = (gamma, s);
            }
        }
        if best.0 > 0 && best.1 >= self.cfg.min_gain {
            best.0
        } else if self.plain_steps + 1 >= self.cfg.probe_every {
            gamma_min // a probe keeps α current
        } else {
            0
        }
    }
}

/// The server-wide estimate of how much faster decoding runs than plain decoding would: tokens
/// emitted per round over the round's measured cost in plain steps, decayed over recent decode
/// rounds of every request (a plain round counts as 1 token for 1 step). Below 1, speculation
/// is losing time: the `tandem_spec_speedup_estimate` gauge and its alert.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpeedupEstimate {
    tokens: f64,
    cost: f64,
}

impl SpeedupEstimate {
    /// Weight of the past per recorded round (≈ the last few hundred rounds).
    const DECAY: f64 = 0.995;

    /// A decode round that drafted `drafted` tokens of which `accepted` stood.
    pub fn record(&mut self, drafted: usize, accepted: usize, costs: &CostModel) {
        let (tokens, cost) = if drafted == 0 {
            (1.0, 1.0)
        } else {
            match costs.round_cost(drafted) {
                Some(c) => ((accepted + 1) as f64, c),
                None => return,
            }
        };
        self.tokens = Self::DECAY * self.tokens + tokens;
        self.cost = Self::DECAY * self.cost + cost;
    }

    /// The estimate, once any round was recorded.
    pub fn get(&self) -> Option<f64> {
        (self.cost > 0.0).then(|| self.tokens / self.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(draft: f64, verify: &[f64]) -> CostModel {
        let mut c = CostModel::new(8);
        c.record_draft(draft * 3.0, 3);
        for (i, &v) in verify.iter().enumerate() {
            c.record_verify(v, i + 1);
        }
        c
    }

    #[test]
    fn expected_speedup_matches_the_paper() {
        // α = 0: every round yields one token at the round's cost.
        assert!((expected_speedup(0.0, 4, 2.0) - 0.5).abs() < 1e-12);
        // α = 1: γ + 1 tokens.
        assert!((expected_speedup(1.0, 3, 2.0) - 2.0).abs() < 1e-12);
        // α = 0.5, γ = 2: 1 + 0.5 + 0.25 tokens.
        assert!((expected_speedup(0.5, 2, 1.0) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn bad_drafter_means_plain_good_drafter_means_speculation() {
        // Draft step 20% of a target step; verifying 2-9 tokens costs 1.2x-3x a step.
        let c = costs(0.2, &[1.0, 1.2, 1.4, 1.6, 1.9, 2.2, 2.5, 2.8, 3.0]);
        let mut bad = Governor::new(GovernorConfig::default());
        let mut good = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            bad.record_round(4, 0);
            good.record_round(4, 4);
        }
        assert_eq!(bad.choose(&c, 1, 8), 0, "α ≈ {}", bad.alpha());
        assert!(good.choose(&c, 1, 8) >= 4, "α ≈ {}", good.alpha());
    }

    #[test]
    fn costly_drafter_is_refused_even_when_it_agrees() {
        // A drafter as slow as the target cannot win at any α on this cost curve.
        let c = costs(1.0, &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(3, 3);
        }
        assert_eq!(g.choose(&c, 1, 8), 0);
    }

    #[test]
    fn plain_decoding_probes_again_and_recovers() {
        let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        let cfg = GovernorConfig::default();
        let mut g = Governor::new(cfg);
        for _ in 0..40 {
            g.record_round(2, 0);
        }
        assert_eq!(g.choose(&c, 1, 8), 0);
        let mut probed = false;
        for _ in 0..cfg.probe_every {
            let gamma = g.choose(&c, 1, 8);
            if gamma > 0 {
                probed = true;
                g.record_round(gamma, gamma);
            } else {
                g.record_round(0, 0);
            }
        }
        assert!(probed, "a probe within probe_every plain steps");
        for _ in 0..30 {
            g.record_round(4, 4);
        }
        assert!(
            g.choose(&c, 1, 8) > 0,
            "speculation comes back once drafts agree"
        );
    }

    #[test]
    fn unmeasured_costs_start_with_the_smallest_gamma() {
        let g = Governor::new(GovernorConfig::default());
        assert_eq!(g.choose(&CostModel::new(8), 2, 8), 2);
    }

    #[test]
    fn verify_costs_are_interpolated_between_measured_widths() {
        let mut c = CostModel::new(8);
        c.record_draft(0.0, 1);
        c.record_verify(1.0, 1);
        c.record_verify(2.0, 3);
        // Width 2 halfway between widths 1 and 3; width 6 extrapolated per token.
        assert!((c.round_cost(1).unwrap() - 1.5).abs() < 1e-12);
        assert!((c.round_cost(5).unwrap() - 4.0).abs() < 1e-12);
    }

    #[test]
    fn speedup_estimate_weighs_tokens_against_round_costs() {
        let mut c = CostModel::new(4);
        c.record_verify(0.010, 1);
        c.record_verify(0.015, 4);
        c.record_draft(0.002, 1);
        let mut e = SpeedupEstimate::default();
        assert_eq!(e.get(), None);
        e.record(0, 0, &c);
        assert!(
            (e.get().unwrap() - 1.0).abs() < 1e-12,
            "plain rounds are 1x"
        );
        let mut e = SpeedupEstimate::default();
        // γ = 3: 3 drafts (0.006 s) + a 4-token verify (0.015 s) = 2.1 plain steps.
        e.record(3, 3, &c);
        assert!((e.get().unwrap() - 4.0 / 2.1).abs() < 1e-9);
        let mut e = SpeedupEstimate::default();
        e.record(3, 0, &c);
        assert!(
            e.get().unwrap() < 1.0,
            "every draft rejected: slower than plain"
        );
    }
}
