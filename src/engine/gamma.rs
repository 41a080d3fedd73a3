//! γ, the number of tokens drafted per round: a checked type, a request's policy for it, and
//! the cap every round obeys.
//!
//! Why it exists: γ arrives from the HTTP API, the config file, the CLI and the admin API, and
//! each round must shrink it near the context or `max_tokens` limit. One type and one cap
//! function keep those rules in one place.

use serde::{Deserialize, Serialize};

/// A number of drafted tokens per round, in `1..=Gamma::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "usize", into = "usize")]
pub struct Gamma(usize);

/// A γ outside what is allowed; its text is the rule, for the caller to prefix with the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidGamma {
    #[error("must be in 1..={max}, got {got}", max = Gamma::MAX)]
    OutOfRange { got: usize },
    #[error("must be <= {limit} (engine.max_gamma), got {got}")]
    OverLimit { got: usize, limit: usize },
}

impl Gamma {
    /// The most any engine may be started for (`engine.max_gamma`).
    pub const MAX: usize = 32;

    pub fn get(self) -> usize {
        self.0
    }

    /// `v` as a γ an engine started for at most `limit` drafted tokens accepts.
    pub fn within(v: usize, limit: usize) -> Result<Self, InvalidGamma> {
        let g = Self::try_from(v)?;
        if v > limit {
            return Err(InvalidGamma::OverLimit { got: v, limit });
        }
        Ok(g)
    }
}

impl TryFrom<usize> for Gamma {
    type Error = InvalidGamma;

    fn try_from(v: usize) -> Result<Self, Self::Error> {
        if (1..=Self::MAX).contains(&v) {
            Ok(Self(v))
        } else {
            Err(InvalidGamma::OutOfRange { got: v })
        }
    }
}

impl From<Gamma> for usize {
    fn from(g: Gamma) -> usize {
        g.0
    }
}

impl std::fmt::Display for Gamma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How a request speculates.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub enum GammaPolicy {
    /// Follow the server's live speculation settings (the admin API can change them mid-request).
    #[default]
    Server,
    /// Speculate even if the server's settings have speculation off: as the server's settings
    /// when they have it on, adaptive otherwise.
    On,
    /// No speculation: plain decoding.
    Off,
    /// Always draft this many tokens (fewer near the context or token limit).
    Fixed(Gamma),
    /// The governor picks γ (or plain decoding) round by round.
    Adaptive,
}

/// What a policy comes to in one round, under the live settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundGamma {
    Plain,
    Fixed(usize),
    /// The governor picks 0 or a γ in `min..=max`.
    Adaptive {
        min: usize,
        max: usize,
    },
}

impl RoundGamma {
    /// Shrunk to at most `cap` drafted tokens (see [`gamma_cap`]).
    pub fn capped(self, cap: usize) -> Self {
        match self {
            Self::Plain => Self::Plain,
            Self::Fixed(g) => Self::Fixed(g.min(cap)),
            Self::Adaptive { min, max } => Self::Adaptive {
                min: min.min(cap),
                max: max.min(cap),
            },
        }
    }
}

/// The most tokens a round may draft for a sequence with `cached` tokens in the target cache
/// (its context minus the last, unverified token), a context of `context_len` tokens and
/// `remaining` tokens left to generate: the verification of `[g, drafts..]` must fit the context,
/// and a round yields up to γ + 1 tokens, which must not pass `max_tokens`.
pub fn gamma_cap(cached: usize, context_len: usize, remaining: usize) -> usize {
    context_len
        .saturating_sub(cached + 1)
        .min(remaining.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_is_checked_against_the_absolute_range_and_the_engine_limit() {
        assert_eq!(Gamma::try_from(4).map(Gamma::get), Ok(4));
        for bad in [0, Gamma::MAX + 1] {
            let e = Gamma::try_from(bad).unwrap_err();
            assert_eq!(e.to_string(), format!("must be in 1..=32, got {bad}"));
        }
        assert_eq!(Gamma::within(8, 8).map(Gamma::get), Ok(8));
        let e = Gamma::within(9, 8).unwrap_err();
        assert_eq!(e.to_string(), "must be <= 8 (engine.max_gamma), got 9");
        let e = serde_json::from_str::<Gamma>("0").unwrap_err();
        assert!(e.to_string().contains("must be in 1..="), "{e}");
    }

    #[test]
    fn the_cap_keeps_the_verification_in_the_context_and_the_output_in_max_tokens() {
        // 100 cached + [g, 4 drafts] = 105 <= 105.
        assert_eq!(gamma_cap(100, 105, 50), 4);
        // A round yields up to γ + 1 tokens: 3 left allows 2 drafts.
        assert_eq!(gamma_cap(10, 1000, 3), 2);
        // No room at all: plain.
        assert_eq!(gamma_cap(104, 105, 50), 0);
        assert_eq!(gamma_cap(200, 105, 50), 0);
        assert_eq!(gamma_cap(10, 1000, 0), 0);
        assert_eq!(
            RoundGamma::Adaptive { min: 2, max: 8 }.capped(3),
            RoundGamma::Adaptive { min: 2, max: 3 }
        );
        assert_eq!(RoundGamma::Fixed(6).capped(1), RoundGamma::Fixed(1));
    }
}
