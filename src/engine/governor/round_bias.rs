//! How far rounds that draft run over their forecast, measured against how far plain rounds
//! do: the correction that keeps the governor from drafting at a loss when its prices are
//! right for plain steps and flattering for speculation.
//!
//! Why it exists: every price is the least of a few recent measurements, which is right for
//! a plain step measured every round, and flattering for what is measured rarely. A wider
//! verification last timed in a quiet spell is priced as that spell's (or as the plain step
//! beside it, when that is fresher), a drafter's step on a machine whose speed swings is its
//! luckiest, and the dispatch around drafting is in no price at all. Near break-even (a
//! drafter that costs half a target step, two in three drafts standing) those few percent
//! decide whether a round pays, and every misjudged round is slower than plain decoding.
//! Measured on the outcome itself, the ratio corrects all of them at once, whatever the cause.

/// A decayed mean of measured over forecast seconds per round, starting at 1 (on the mark)
/// with the weight of a few rounds.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
struct OverForecast {
    sum: f64,
    weight: f64,
}

impl OverForecast {
    /// The weight the starting value of 1 keeps: a first round does not decide everything.
    const PRIOR_ROUNDS: f64 = 3.0;

    fn new() -> Self {
        Self {
            sum: Self::PRIOR_ROUNDS,
            weight: Self::PRIOR_ROUNDS,
        }
    }

    /// One round's ratio, clamped: a preempted round (a burst of other work) says nothing
    /// about the forecast, and a wild one must not decide the next hundred.
    fn record(&mut self, forecast: f64, measured: f64, decay: f64) {
        if !(forecast > 0.0 && measured.is_finite() && measured > 0.0) {
            return;
        }
        let ratio = (measured / forecast).clamp(0.5, 3.0);
        self.sum = decay * self.sum + ratio;
        self.weight = decay * self.weight + 1.0;
    }

    fn get(&self) -> f64 {
        self.sum / self.weight
    }
}

/// Measured over forecast seconds for rounds in which someone drafted and for plain rounds,
/// both of the decoding alone (a prompt chunk in the forward, or a catch-up on what the
/// drafter missed, is no part of it: a catch-up is an investment the plan weighs apart).
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct RoundBias {
    drafting: OverForecast,
    plain: OverForecast,
}

impl Default for RoundBias {
    fn default() -> Self {
        Self {
            drafting: OverForecast::new(),
            plain: OverForecast::new(),
        }
    }
}

impl RoundBias {
    /// Weight of the past per drafting round (≈ the last 30): drafting can be rare.
    const DRAFTING_DECAY: f64 = 0.97;
    /// Weight of the past per plain round (≈ the last 100): plain rounds are many.
    const PLAIN_DECAY: f64 = 0.99;
    /// The most the correction scales a forecast: beyond it the drafter does not pay anyway.
    pub const MAX: f64 = 2.0;

    /// A decoding round forecast to take `forecast` seconds took `measured`.
    pub fn record(&mut self, drafting: bool, forecast: f64, measured: f64) {
        if drafting {
            self.drafting
                .record(forecast, measured, Self::DRAFTING_DECAY);
        } else {
            self.plain.record(forecast, measured, Self::PLAIN_DECAY);
        }
    }

    /// How many times its forecast a plain round has cost lately: what a plain step costs
    /// as it runs, over its price (the least of recent measurements).
    pub fn plain(&self) -> f64 {
        self.plain.get()
    }

    /// How many times its forecast a round that drafts is expected to cost, relative to a
    /// plain round's: at least 1 (forecasts that turned out pessimistic are kept, so noise
    /// never talks the governor into drafting), at most [`Self::MAX`].
    pub fn get(&self) -> f64 {
        (self.drafting.get() / self.plain.get()).clamp(1.0, Self::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafting_rounds_over_their_forecast_scale_it_relative_to_plain_ones() {
        let mut b = RoundBias::default();
        assert_eq!(b.get(), 1.0, "nothing measured: on the mark");
        // Plain rounds run 10% over their price (noise only adds), drafting rounds 43%.
        for _ in 0..300 {
            b.record(false, 0.010, 0.011);
        }
        for _ in 0..100 {
            b.record(true, 0.020, 0.0286);
        }
        assert!((b.get() - 1.3).abs() < 0.01, "{}", b.get());
        // Drafting that comes in under its forecast never scales it below 1.
        for _ in 0..100 {
            b.record(true, 0.020, 0.015);
        }
        assert_eq!(b.get(), 1.0);
        // One wild round moves it only so far; many bounded by MAX.
        let mut b = RoundBias::default();
        b.record(true, 0.020, 2.0);
        assert!(b.get() < 1.6, "{}", b.get());
        for _ in 0..100 {
            b.record(true, 0.020, 2.0);
        }
        assert_eq!(b.get(), RoundBias::MAX);
        // Nothing to learn from a round with no forecast or a broken clock.
        let mut b = RoundBias::default();
        b.record(true, 0.0, 0.05);
        b.record(true, 0.01, f64::NAN);
        assert_eq!(b.get(), 1.0);
    }
}
