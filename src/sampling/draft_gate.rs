//! Confidence-gated drafting: a draft model stops drafting a round when it is unsure of the
//! next token, by the smoothed entropy of its distribution or by its top probability
//! (llama.cpp's `--draft-p-min`).
//!
//! EGAG, entropy-gated γ, is the entropy rule's name in the speculative-decoding literature
//! tandem follows (and in the `use_egag`/`egag_*` settings): before keeping each drafted
//! token, the drafter's normalized entropy `H(q) / ln |V|` (0 for a certain drafter, 1 for a
//! uniform one) goes into an exponential moving average, `ema = β·ema + (1 − β)·entropy` with
//! `β = egag_ema_beta`, and the round stops drafting once the average passes `egag_threshold`.
//!
//! Why it exists: every drafted token widens the target's verification, and a token the
//! drafter itself is unsure of is mostly rejected. The gate is pure, a distribution in and a
//! decision out, so the drafter, the tests and the docs share one rule. It changes only how
//! many tokens are drafted, never which: outputs stay exactly the target's.

use serde::Serialize;

use super::float_rule::{serialize_widened, FloatRule};

/// The gate's settings: server-wide in `[speculation]` (live through the admin API and the
/// config file), per request in the `speculative` object.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DraftGate {
    /// Stop when the exponential moving average of the normalized entropy exceeds
    /// `egag_threshold`.
    pub use_egag: bool,
    /// In (0, 1]: 0 is a certain drafter, 1 a uniform one.
    #[serde(serialize_with = "serialize_widened")]
    pub egag_threshold: f32,
    /// In [0, 1): `ema = beta * ema + (1 - beta) * entropy`, seeded by the first token's entropy.
    #[serde(serialize_with = "serialize_widened")]
    pub egag_ema_beta: f32,
    /// In [0, 1): stop when the drafter's top probability is below it; 0 turns it off.
    #[serde(serialize_with = "serialize_widened")]
    pub draft_p_min: f32,
}

impl DraftGate {
    /// No gating; EGAG's thresholds at their defaults for when it is switched on.
    pub const OFF: Self = Self {
        use_egag: false,
        egag_threshold: 0.5,
        egag_ema_beta: 0.5,
        draft_p_min: 0.0,
    };

    /// Whether the gate can stop a round (and so needs each token's confidence).
    pub fn is_on(&self) -> bool {
        self.use_egag || self.draft_p_min > 0.0
    }

    /// `egag_threshold`'s range (each rule fails NaN).
    pub const THRESHOLD_RULE: FloatRule = FloatRule {
        rule: "must be in (0, 1]",
        holds: |t| t > 0.0 && t <= 1.0,
    };
    /// `egag_ema_beta`'s range.
    pub const EMA_BETA_RULE: FloatRule = FloatRule {
        rule: "must be in [0, 1)",
        holds: |b| (0.0..1.0).contains(&b),
    };
    /// `draft_p_min`'s range.
    pub const P_MIN_RULE: FloatRule = FloatRule {
        rule: "must be in [0, 1) (0 = off)",
        holds: |p| (0.0..1.0).contains(&p),
    };

    /// The first setting out of range, as (key, rule).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for (key, rule, v) in [
            ("egag_threshold", Self::THRESHOLD_RULE, self.egag_threshold),
            ("egag_ema_beta", Self::EMA_BETA_RULE, self.egag_ema_beta),
            ("draft_p_min", Self::P_MIN_RULE, self.draft_p_min),
        ] {
            rule.check(v).map_err(|e| (key, e.to_string()))?;
        }
        Ok(())
    }
}

impl Default for DraftGate {
    fn default() -> Self {
        Self::OFF
    }
}

/// A request's own gate settings over the server's: each `None` follows the live setting.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestGate {
    pub use_egag: Option<bool>,
    pub egag_threshold: Option<f32>,
    pub egag_ema_beta: Option<f32>,
    pub draft_p_min: Option<f32>,
}

impl RequestGate {
    /// `gate` with these settings applied (unchecked: see [`DraftGate::check`]).
    pub fn over(&self, gate: DraftGate) -> DraftGate {
        DraftGate {
            use_egag: self.use_egag.unwrap_or(gate.use_egag),
            egag_threshold: self.egag_threshold.unwrap_or(gate.egag_threshold),
            egag_ema_beta: self.egag_ema_beta.unwrap_or(gate.egag_ema_beta),
            draft_p_min: self.draft_p_min.unwrap_or(gate.draft_p_min),
        }
    }

    /// The first given setting out of range, as [`DraftGate::check`] names it.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        self.over(DraftGate::OFF).check()
    }
}

/// How sure a drafter is of its next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Confidence {
    /// Entropy over ln(vocabulary size): 0 for a certain drafter, 1 for a uniform one.
    pub entropy: f32,
    /// The largest probability.
    pub top: f32,
}

/// The confidence of a probability vector (summing to 1).
pub fn confidence(probs: &[f32]) -> Confidence {
    let mut h = 0f64;
    let mut top = 0f32;
    for &p in probs {
        if p > 0.0 {
            h -= f64::from(p) * f64::from(p).ln();
        }
        top = top.max(p);
    }
    let max_h = (probs.len().max(2) as f64).ln();
    Confidence {
        entropy: (h / max_h).clamp(0.0, 1.0) as f32,
        top,
    }
}

/// The confidence of logits at temperature 1 (a greedy drafter samples nothing, but its
/// distribution is still the softmax of what it picks the argmax of). `scratch` is reused.
pub fn confidence_of_logits(logits: &[f32], scratch: &mut Vec<f32>) -> Confidence {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    scratch.clear();
    scratch.extend(logits.iter().map(|&l| l - max));
    crate::model::kernels::elementwise::exp_nonpositive(scratch);
    let mut sum = 0f64;
    for (e, &l) in scratch.iter_mut().zip(logits) {
        if l == f32::NEG_INFINITY {
            *e = 0.0;
        }
        sum += f64::from(*e);
    }
    let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    for p in scratch.iter_mut() {
        *p *= inv;
    }
    confidence(scratch)
}

/// One sequence's gate through one round of drafting.
#[derive(Clone, Copy, Debug, Default)]
pub struct GateRound {
    ema: Option<f32>,
    drafted: usize,
}

impl GateRound {
    /// Whether to draft the next token, whose distribution has confidence `c`. The first
    /// `min_tokens` are always drafted (γ stays at or above `gamma_min`).
    pub fn admit(&mut self, gate: &DraftGate, min_tokens: usize, c: Confidence) -> bool {
        let beta = gate.egag_ema_beta;
        let ema = match self.ema {
            Some(prev) => beta * prev + (1.0 - beta) * c.entropy,
            None => c.entropy,
        };
        self.ema = Some(ema);
        let unsure = (gate.use_egag && ema > gate.egag_threshold)
            || (gate.draft_p_min > 0.0 && c.top < gate.draft_p_min);
        if unsure && self.drafted >= min_tokens {
            return false;
        }
        self.drafted += 1;
        true
    }

    /// The smoothed entropy after the last token seen (for logs).
    pub fn ema(&self) -> Option<f32> {
        self.ema
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(entropy: f32, top: f32) -> Confidence {
        Confidence { entropy, top }
    }

    #[test]
    fn confidence_is_zero_for_a_point_mass_and_one_for_uniform() {
        let mut point = vec![0.0; 8];
        point[3] = 1.0;
        assert_eq!(confidence(&point), conf(0.0, 1.0));
        let uniform = vec![0.125; 8];
        let c = confidence(&uniform);
        assert!((c.entropy - 1.0).abs() < 1e-6 && c.top == 0.125, "{c:?}");
        // Two equal tokens out of 4: ln 2 / ln 4 = 0.5.
        let c = confidence(&[0.5, 0.5, 0.0, 0.0]);
        assert!((c.entropy - 0.5).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn logits_give_the_confidence_of_their_softmax() {
        let logits = [2.0f32, 1.0, 0.0, f32::NEG_INFINITY];
        let e: Vec<f32> = logits.iter().map(|l| l.exp()).collect();
        let s: f32 = e.iter().sum();
        let probs: Vec<f32> = e.iter().map(|v| v / s).collect();
        let mut scratch = Vec::new();
        let a = confidence_of_logits(&logits, &mut scratch);
        let b = confidence(&probs);
        assert!((a.entropy - b.entropy).abs() < 1e-6 && (a.top - b.top).abs() < 1e-6);
    }

    #[test]
    fn egag_stops_when_the_smoothed_entropy_passes_the_threshold() {
        let gate = DraftGate {
            use_egag: true,
            egag_threshold: 0.5,
            egag_ema_beta: 0.5,
            ..DraftGate::OFF
        };
        let mut round = GateRound::default();
        // ema: 0.2, then 0.5 * 0.2 + 0.5 * 0.7 = 0.45 (under), then 0.5 * 0.45 + 0.5 * 0.7 = 0.575.
        assert!(round.admit(&gate, 1, conf(0.2, 0.9)));
        assert!(round.admit(&gate, 1, conf(0.7, 0.3)));
        assert!(!round.admit(&gate, 1, conf(0.7, 0.3)));
        assert!((round.ema().unwrap() - 0.575).abs() < 1e-6);
        // Without smoothing the second token already stops it.
        let sharp = DraftGate {
            egag_ema_beta: 0.0,
            ..gate
        };
        let mut round = GateRound::default();
        assert!(round.admit(&sharp, 1, conf(0.2, 0.9)));
        assert!(!round.admit(&sharp, 1, conf(0.7, 0.3)));
    }

    #[test]
    fn the_first_min_tokens_are_always_drafted_and_off_never_stops() {
        let gate = DraftGate {
            use_egag: true,
            egag_threshold: 0.1,
            ..DraftGate::OFF
        };
        let mut round = GateRound::default();
        assert!(round.admit(&gate, 2, conf(0.9, 0.01)));
        assert!(round.admit(&gate, 2, conf(0.9, 0.01)));
        assert!(!round.admit(&gate, 2, conf(0.9, 0.01)));
        let mut round = GateRound::default();
        for _ in 0..10 {
            assert!(round.admit(&DraftGate::OFF, 1, conf(1.0, 0.0)));
        }
        assert!(!DraftGate::OFF.is_on());
    }

    #[test]
    fn p_min_stops_on_a_low_top_probability() {
        let gate = DraftGate {
            draft_p_min: 0.6,
            ..DraftGate::OFF
        };
        assert!(gate.is_on());
        let mut round = GateRound::default();
        assert!(round.admit(&gate, 1, conf(0.9, 0.1)));
        assert!(round.admit(&gate, 1, conf(0.1, 0.7)));
        assert!(!round.admit(&gate, 1, conf(0.1, 0.5)));
    }

    #[test]
    fn out_of_range_settings_name_their_key() {
        let cases = [
            (
                DraftGate {
                    egag_threshold: 0.0,
                    ..DraftGate::OFF
                },
                "egag_threshold",
            ),
            (
                DraftGate {
                    egag_threshold: 1.5,
                    ..DraftGate::OFF
                },
                "egag_threshold",
            ),
            (
                DraftGate {
                    egag_threshold: f32::NAN,
                    ..DraftGate::OFF
                },
                "egag_threshold",
            ),
            (
                DraftGate {
                    egag_ema_beta: 1.0,
                    ..DraftGate::OFF
                },
                "egag_ema_beta",
            ),
            (
                DraftGate {
                    egag_ema_beta: -0.1,
                    ..DraftGate::OFF
                },
                "egag_ema_beta",
            ),
            (
                DraftGate {
                    egag_ema_beta: f32::NAN,
                    ..DraftGate::OFF
                },
                "egag_ema_beta",
            ),
            (
                DraftGate {
                    draft_p_min: 1.0,
                    ..DraftGate::OFF
                },
                "draft_p_min",
            ),
            (
                DraftGate {
                    draft_p_min: f32::NAN,
                    ..DraftGate::OFF
                },
                "draft_p_min",
            ),
        ];
        for (gate, key) in cases {
            assert_eq!(gate.check().unwrap_err().0, key, "{gate:?}");
        }
        DraftGate::OFF.check().unwrap();
    }
}
