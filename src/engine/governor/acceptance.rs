//! Per-request acceptance: a decayed estimate of how often the drafter's tokens stand, and when a
//! request decoding plainly should probe speculation again.

use super::config::GovernorConfig;
use super::planner::{Candidate, Choice};

/// A decayed acceptance rate: accepted / (accepted + rejected) over recent drafts, with two
/// pseudo-drafts at a prior rate so a first round does not decide everything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptanceRate {
    accepted: f64,
    rejected: f64,
    prior: f64,
}

impl AcceptanceRate {
    /// An estimate that starts at `prior` (clamped to [0, 1]).
    pub fn new(prior: f64) -> Self {
        Self {
            accepted: 0.0,
            rejected: 0.0,
            prior: if prior.is_finite() {
                prior.clamp(0.0, 1.0)
            } else {
                0.5
            },
        }
    }

    pub fn get(&self) -> f64 {
        (self.accepted + 2.0 * self.prior) / (self.accepted + self.rejected + 2.0)
    }

    /// A round in which `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection); the past weighs `decay` per
    /// drafted token.
    pub fn record(&mut self, drafted: usize, accepted: usize, decay: f64) {
        if drafted == 0 {
            return;
        }
        let d = decay.powi(drafted as i32);
        self.accepted = d * self.accepted + accepted as f64;
        self.rejected = d * self.rejected + f64::from(u8::from(accepted < drafted));
    }
}

/// One request's governor: its acceptance rate, and when it last speculated.
#[derive(Clone, Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    rate: AcceptanceRate,
    plain_steps: usize,
    /// Plain steps before the next probe.
    probe_wait: usize,
    /// The last round was a probe.
    probed: bool,
}

impl Governor {
    /// A governor with no idea yet how well its drafter does (a prior rate of one half).
    pub fn new(cfg: GovernorConfig) -> Self {
        Self::with_prior(cfg, 0.5)
    }

    /// A governor whose acceptance estimate starts at `prior`: what the drafter achieved
    /// lately on other requests. Starting every request at one half would make each one
    /// decode plainly until probes proved the drafter, even when it is nearly always right.
    pub fn with_prior(cfg: GovernorConfig, prior: f64) -> Self {
        Self {
            cfg,
            rate: AcceptanceRate::new(prior),
            plain_steps: 0,
            probe_wait: cfg.probe_every.max(1),
            probed: false,
        }
    }

    /// The acceptance rate estimate (see [`AcceptanceRate`]).
    pub fn alpha(&self) -> f64 {
        self.rate.get()
    }

    /// Records a round: `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection).
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        let base = self.cfg.probe_every.max(1);
        if std::mem::take(&mut self.probed) {
            // The round after a probe tells whether the probe brought speculation back.
            self.probe_wait = if drafted == 0 {
                (self.probe_wait * 2).min(base * 16)
            } else {
                base
            };
        }
        if drafted == 0 {
            self.plain_steps += 1;
            return;
        }
        self.probed = self.plain_steps > 0 && self.plain_steps + 1 >= self.probe_wait;
        self.plain_steps = 0;
        self.rate.record(drafted, accepted, self.cfg.decay);
    }

    /// This request's say in the next round's plan, γ in `gamma_min..=gamma_max` or plain:
    /// free, or a probe at `gamma_min` after enough plain steps so α stays current.
    pub fn candidate(
        &self,
        gamma_min: usize,
        gamma_max: usize,
        catch_up: usize,
        remaining: usize,
    ) -> Candidate {
        let gamma_min = gamma_min.max(1).min(gamma_max);
        let choice = if gamma_max == 0 {
            Choice::Fixed(0)
        } else if self.plain_steps + 1 >= self.probe_wait {
            Choice::Probe {
                gamma: gamma_min,
                max: gamma_max,
            }
        } else {
            Choice::Free {
                min: gamma_min,
                max: gamma_max,
            }
        };
        Candidate {
            alpha: self.alpha(),
            choice,
            catch_up,
            remaining,
            depth: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::governor::test_support::{costs, solo};

    #[test]
    fn a_new_request_starts_from_what_the_drafter_achieved_lately() {
        let c = costs(0.45, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]);
        let cfg = GovernorConfig::default();
        // Knowing nothing, a request decodes plainly first (it will probe).
        assert_eq!(solo(&Governor::new(cfg), &c), 0);
        // After other requests' drafts mostly stood, a new one speculates from its first round.
        let mut pooled = AcceptanceRate::new(0.5);
        for _ in 0..40 {
            pooled.record(4, 4, 0.99);
        }
        pooled.record(4, 1, 0.99);
        assert!(pooled.get() > 0.9, "{}", pooled.get());
        let g = Governor::with_prior(cfg, pooled.get());
        assert!(solo(&g, &c) >= 3, "γ = {}", solo(&g, &c));
        // The prior weighs two drafts: a request whose own drafts fail leaves it quickly.
        let mut g = g;
        for _ in 0..3 {
            g.record_round(2, 0);
        }
        assert_eq!(solo(&g, &c), 0, "α ≈ {}", g.alpha());
    }

    #[test]
    fn plain_decoding_probes_again_and_recovers() {
        let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        let cfg = GovernorConfig::default();
        let mut g = Governor::new(cfg);
        for _ in 0..40 {
            g.record_round(2, 0);
        }
        assert_eq!(solo(&g, &c), 0);
        let mut probed = false;
        for _ in 0..cfg.probe_every {
            let gamma = solo(&g, &c);
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
        assert!(solo(&g, &c) > 0, "speculation comes back once drafts agree");
    }

    #[test]
    fn probes_that_fail_wait_longer_each_time() {
        let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        let cfg = GovernorConfig::default();
        let mut g = Governor::new(cfg);
        for _ in 0..40 {
            g.record_round(2, 0);
        }
        // Every probe is rejected: the gaps between probes grow 16, 32, 64.
        let mut probes = Vec::new();
        for step in 0..200 {
            let gamma = solo(&g, &c);
            if gamma > 0 {
                probes.push(step);
            }
            g.record_round(gamma, 0);
        }
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 2, "{probes:?}");
        assert!(gaps.windows(2).all(|w| w[1] >= 2 * w[0] - 1), "{gaps:?}");
    }
}
