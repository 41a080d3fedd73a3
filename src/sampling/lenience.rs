//! The lenience knob (relaxed acceptance, the paper's appendix A.5) as a checked type.
//!
//! Why it exists: lenience arrives from five boundaries (HTTP, config, CLI, admin API, the
//! reference loops' callers) and must be in (0, 1] everywhere. Checking it once, when a
//! `Lenience` is made, gives every boundary the same rule and the same error text, and lets the
//! layers below trust the value.

use serde::{Deserialize, Serialize};

use super::float_rule::{widen, FloatRule, OutOfRange};

/// Relaxed acceptance in (0, 1]; 1 is exact (the target's distribution, greedy: identical
/// output).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Lenience(f32);

/// A value outside (0, 1]; its text is the rule and the number as sent, for the caller to
/// prefix with the key.
pub type InvalidLenience = OutOfRange;

impl Lenience {
    /// Exact acceptance: the output is distributed exactly as the target's.
    pub const EXACT: Self = Self(1.0);

    /// The rule every boundary checks.
    pub const RULE: FloatRule = FloatRule {
        rule: "must be in (0, 1] (1 = exact)",
        holds: |v| v > 0.0 && v <= 1.0,
    };

    pub fn get(self) -> f32 {
        self.0
    }

    pub fn is_exact(self) -> bool {
        self.0 >= 1.0
    }
}

impl Default for Lenience {
    fn default() -> Self {
        Self::EXACT
    }
}

/// A lenience as sent (JSON, TOML, a flag): checked before and after narrowing to `f32`.
impl TryFrom<f64> for Lenience {
    type Error = InvalidLenience;

    fn try_from(v: f64) -> Result<Self, Self::Error> {
        Self::RULE.narrow(v).map(Self)
    }
}

impl TryFrom<f32> for Lenience {
    type Error = InvalidLenience;

    fn try_from(v: f32) -> Result<Self, Self::Error> {
        Self::RULE.check(v).map(Self)
    }
}

impl From<Lenience> for f32 {
    fn from(l: Lenience) -> f32 {
        l.0
    }
}

/// As written: 0.9, not 0.8999999761581421.
impl From<Lenience> for f64 {
    fn from(l: Lenience) -> f64 {
        widen(l.0)
    }
}

impl std::fmt::Display for Lenience {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_half_open_unit_interval_is_a_lenience() {
        for ok in [1.0f32, 0.5, f32::MIN_POSITIVE] {
            assert_eq!(Lenience::try_from(ok).map(Lenience::get), Ok(ok));
        }
        for bad in [0.0f32, -0.5, 1.0001, f32::NAN, f32::INFINITY] {
            let e = Lenience::try_from(bad).unwrap_err();
            assert!(e.to_string().starts_with("must be in (0, 1]"), "{e}");
        }
        assert!(Lenience::EXACT.is_exact() && !Lenience::try_from(0.9).unwrap().is_exact());
    }

    #[test]
    fn serde_checks_the_value() {
        let l: Lenience = serde_json::from_str("0.25").unwrap();
        assert_eq!(l.get(), 0.25);
        assert_eq!(serde_json::to_string(&l).unwrap(), "0.25");
        let e = serde_json::from_str::<Lenience>("1.5").unwrap_err();
        assert!(e.to_string().contains("must be in (0, 1]"), "{e}");
        let l: Lenience = serde_json::from_str("0.9").unwrap();
        assert_eq!(serde_json::to_value(l).unwrap(), serde_json::json!(0.9));
        let e = serde_json::from_str::<Lenience>("1e-300").unwrap_err();
        assert!(e.to_string().contains("got 1e-300"), "{e}");
    }
}
