//! What a round's first draft step costs: a drafter forward as wide as the tokens fed into it.
//!
//! Why it exists: a round's own feed (the last draft and the target's bonus token, or for a
//! drafter of another vocabulary the new text in its tokens) goes into the first step, and a
//! wider feed costs more. One price per batch size, the least of recent first steps, priced
//! every first step at the narrowest feed's cost; wider feeds then ran over their forecast, and
//! the bias that follows overruns scaled every later step too. Priced here by width (tokens fed
//! in all), each width at its own least recent cost, at the feed recent rounds brought: for
//! SmolLM2 drafting for Gemma 3, rounds' draft forecasts came within 0.150 (mean |log|) of what
//! they took, against 0.262 with one price (docs/performance.md).

use super::CostEstimate;

/// First-step prices by the tokens fed into the step, and how many tokens a sequence's feed
/// has held lately.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct FirstStep {
    /// `by_width[w - 1]`: a first step taking in `w` tokens in all (every drafting sequence's
    /// feed together). Feeds past the last width are kept there, per token.
    by_width: Vec<CostEstimate>,
    /// Tokens a sequence's first step has taken in lately: a decayed average (the rounds'
    /// own counts, no timing noise in them); 0 before any is recorded.
    feed: f64,
}

impl Default for FirstStep {
    fn default() -> Self {
        Self {
            by_width: vec![CostEstimate::default(); Self::WIDTHS],
            feed: 0.0,
        }
    }
}

impl FirstStep {
    /// Widest first step priced apart: a batch of a few sequences with routine feeds.
    const WIDTHS: usize = 32;
    /// The weight of the newest round's feed in the average.
    const FEED_WEIGHT: f64 = 0.1;

    pub fn estimates_mut(&mut self) -> impl Iterator<Item = &mut CostEstimate> {
        self.by_width.iter_mut()
    }

    /// A first step of `seqs` sequences that took `seconds` to take in `tokens` tokens in all
    /// (0: not counted, taken as one a sequence and not averaged into the feed).
    pub fn record(&mut self, seconds: f64, tokens: usize, seqs: usize) {
        if seqs == 0 {
            return;
        }
        if tokens > 0 {
            let each = tokens as f64 / seqs as f64;
            self.feed = match self.feed {
                0.0 => each,
                f => (1.0 - Self::FEED_WEIGHT) * f + Self::FEED_WEIGHT * each,
            };
        }
        let width = tokens.max(seqs);
        let last = self.by_width.len();
        if width <= last {
            self.by_width[width - 1].record(seconds);
        } else {
            self.by_width[last - 1].record(seconds * last as f64 / width as f64);
        }
    }

    /// Seconds of a first step of `seqs` sequences, each taking in what feeds have held
    /// lately (`None` before any first step is measured).
    pub fn seconds(&self, seqs: usize) -> Option<f64> {
        self.seconds_at(seqs as f64 * self.feed.max(1.0))
    }

    /// Seconds of a first step `width` tokens wide: its width's price, interpolated between
    /// the nearest measured widths, or past the widest along the line through the two widest
    /// (never falling); never below a narrower measured width's price (a wider forward does
    /// not cost less), and at least the narrowest measured price below it.
    fn seconds_at(&self, width: f64) -> Option<f64> {
        let measured: Vec<(f64, f64)> = self
            .by_width
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.get().map(|v| ((i + 1) as f64, v)))
            .collect();
        let (&(w0, p0), &(wn, pn)) = (measured.first()?, measured.last()?);
        let floor = measured
            .iter()
            .filter(|&&(w, _)| w <= width)
            .map(|&(_, p)| p)
            .fold(0.0, f64::max);
        let price = if width <= w0 {
            p0
        } else if width >= wn {
            match measured.len() {
                1 => pn,
                n => {
                    let (wb, pb) = measured[n - 2];
                    pn + ((pn - pb) / (wn - wb)).max(0.0) * (width - wn)
                }
            }
        } else {
            let i = measured.iter().position(|&(w, _)| w >= width)?;
            let ((wa, pa), (wb, pb)) = (measured[i - 1], measured[i]);
            pa + (width - wa) / (wb - wa) * (pb - pa)
        };
        Some(price.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_width_keeps_its_own_price_and_the_feed_sets_the_width_priced() {
        let mut f = FirstStep::default();
        assert_eq!(f.seconds(1), None);
        // Two-token feeds at 7 ms, six-token ones at 15.
        f.record(0.007, 2, 1);
        f.record(0.015, 6, 1);
        assert!((f.seconds_at(2.0).unwrap() - 0.007).abs() < 1e-12);
        assert!((f.seconds_at(4.0).unwrap() - 0.011).abs() < 1e-12);
        // The feed averages 2 then 6 at weight 0.1: 2.4 tokens.
        assert!((f.feed - 2.4).abs() < 1e-12);
        assert!((f.seconds(1).unwrap() - 0.0078).abs() < 1e-12);
        // Two sequences of such feeds: 4.8 tokens wide.
        assert!((f.seconds(2).unwrap() - 0.0126).abs() < 1e-12);
    }

    #[test]
    fn narrower_and_wider_steps_than_measured_are_bounded_by_the_measured_ones() {
        let mut f = FirstStep::default();
        f.record(0.007, 2, 1);
        assert_eq!(f.seconds_at(1.0), Some(0.007));
        assert_eq!(f.seconds_at(9.0), Some(0.007), "one width: its price");
        f.record(0.009, 3, 1);
        // Past the widest: along the line through the two widest, 2 ms a token.
        assert!((f.seconds_at(6.0).unwrap() - 0.015).abs() < 1e-12);
        // A noisy narrow width never makes a wider one cheaper.
        f.record(0.012, 1, 1);
        assert!(f.seconds_at(2.0).unwrap() >= 0.012);
        assert!(f.seconds_at(6.0).unwrap() >= 0.012);
    }

    #[test]
    fn feeds_not_counted_are_one_token_a_sequence_and_leave_the_average_alone() {
        let mut f = FirstStep::default();
        f.record(0.004, 0, 2);
        assert_eq!(f.feed, 0.0);
        assert_eq!(f.seconds(2), Some(0.004));
        // Feeds past the widest priced width are kept there at their per-token price.
        f.record(0.064, 64, 1);
        assert!((f.seconds_at(32.0).unwrap() - 0.032).abs() < 1e-12);
    }
}
