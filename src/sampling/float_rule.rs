//! Float settings in the decimals people write: checked, refused and read back as sent.
//!
//! Why it exists: settings arrive as 64-bit numbers (JSON, TOML, flags) and the engine keeps
//! them as `f32`. Narrowing first turns 1e-300 into 0, so a refusal would quote a number
//! nobody sent; widening an `f32` back with `f64::from` turns 0.9 into 0.8999999761581421, so
//! a read-back would not match what was written. Checking the number as sent, and widening
//! through the `f32`'s shortest decimal, keeps every boundary in the client's own numbers.

use serde::Serializer;

/// `x` as the `f64` of its shortest decimal: 0.9 for `0.9f32`, not 0.8999999761581421.
pub fn widen(x: f32) -> f64 {
    // An f32's Display is the shortest decimal that reads back as it, so it is what was
    // written wherever the f32 came from a decimal.
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// Serializes an `f32` setting as [`widen`] gives it (for `#[serde(serialize_with)]`):
/// `serde_json::to_value` would otherwise widen it with `f64::from`.
pub fn serialize_widened<S: Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(widen(*x))
}

/// A number in its shortest decimal, with an exponent where plain digits would run long
/// (`1e-300`, not 300 zeros).
struct Shortest(f64);

impl std::fmt::Display for Shortest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.0.abs();
        if a == 0.0 || !a.is_finite() || (1e-4..1e16).contains(&a) {
            write!(f, "{}", self.0)
        } else {
            write!(f, "{:e}", self.0)
        }
    }
}

/// The range of a float setting: its rule in words and the test of it.
#[derive(Clone, Copy, Debug)]
pub struct FloatRule {
    /// The rule as a refusal states it, after the key: `must be in (0, 1]`.
    pub rule: &'static str,
    /// Whether a value obeys the rule; false for NaN.
    pub holds: fn(f64) -> bool,
}

/// A float setting outside its range; its text is the rule and the number as sent, for the
/// caller to prefix with the key.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("{rule}, got {}", got(.sent, .narrowed))]
pub struct OutOfRange {
    pub rule: &'static str,
    /// The number as it arrived.
    pub sent: f64,
    /// What the engine's `f32` made of it, where that and not the number sent broke the rule.
    pub narrowed: Option<f32>,
}

fn got(sent: &f64, narrowed: &Option<f32>) -> String {
    match narrowed {
        Some(n) => format!(
            "{} ({} as a 32-bit float)",
            Shortest(*sent),
            Shortest(widen(*n))
        ),
        None => Shortest(*sent).to_string(),
    }
}

impl FloatRule {
    /// `sent` as the `f32` the engine keeps, if both it and that `f32` obey the rule (1e-300 is
    /// in (0, 1] but its `f32` is 0).
    pub fn narrow(&self, sent: f64) -> Result<f32, OutOfRange> {
        let kept = sent as f32;
        let refused = |narrowed| OutOfRange {
            rule: self.rule,
            sent,
            narrowed,
        };
        if !(self.holds)(sent) {
            return Err(refused(None));
        }
        if !(self.holds)(f64::from(kept)) {
            return Err(refused(Some(kept)));
        }
        Ok(kept)
    }

    /// `x` if it obeys the rule; a refusal quotes its shortest decimal.
    pub fn check(&self, x: f32) -> Result<f32, OutOfRange> {
        if (self.holds)(f64::from(x)) {
            Ok(x)
        } else {
            Err(OutOfRange {
                rule: self.rule,
                sent: widen(x),
                narrowed: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: FloatRule = FloatRule {
        rule: "must be in (0, 1]",
        holds: |v| v > 0.0 && v <= 1.0,
    };

    #[test]
    fn f32_settings_widen_to_the_decimal_written() {
        assert_eq!(widen(0.9), 0.9);
        assert_eq!(widen(0.1), 0.1);
        assert_eq!(widen(1.0), 1.0);
        assert_ne!(f64::from(0.9f32), 0.9, "the naive widening this replaces");
        assert_eq!(widen(f32::MIN_POSITIVE) as f32, f32::MIN_POSITIVE);
        assert!(widen(f32::NAN).is_nan());
        let json = serde_json::to_string(&serde_json::json!(widen(0.9f32))).unwrap();
        assert_eq!(json, "0.9");
    }

    #[test]
    fn a_refusal_quotes_the_number_as_sent() {
        let e = UNIT.narrow(1e-300).unwrap_err();
        assert_eq!(
            e.to_string(),
            "must be in (0, 1], got 1e-300 (0 as a 32-bit float)"
        );
        assert_eq!(
            UNIT.narrow(1.1).unwrap_err().to_string(),
            "must be in (0, 1], got 1.1"
        );
        assert_eq!(
            UNIT.narrow(1e300).unwrap_err().to_string(),
            "must be in (0, 1], got 1e300"
        );
        assert_eq!(
            UNIT.narrow(-2.0).unwrap_err().to_string(),
            "must be in (0, 1], got -2"
        );
        assert_eq!(
            UNIT.check(1.1).unwrap_err().to_string(),
            "must be in (0, 1], got 1.1"
        );
        assert!(UNIT.narrow(f64::NAN).is_err());
        assert_eq!(UNIT.narrow(0.9), Ok(0.9f32));
        assert_eq!(UNIT.narrow(1e-30), Ok(1e-30f32));
        assert_eq!(UNIT.check(0.9), Ok(0.9f32));
    }
}
