//! Tokens generated per second lately, from the engine's running total, for the load report.
//!
//! Why it exists: a router weighs a replica's queue by how fast it works (smg's expected wait
//! is queued tokens over throughput). The engine counts tokens; a rate needs two samples far
//! enough apart, and a router's polls (every few seconds) are the samples.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Samples closer than this keep the rate measured before (a burst of polls measures nothing).
const MIN_SPAN: Duration = Duration::from_secs(1);

/// The latest rate, and the sample it will be measured from next.
#[derive(Debug, Default)]
pub(super) struct ThroughputMeter {
    state: Mutex<Option<Sample>>,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    total: u64,
    rate: f64,
}

impl ThroughputMeter {
    /// Tokens per second between the previous sample and this one (`total` tokens generated
    /// since start, at `at`); 0 before two samples a second apart.
    pub(super) fn rate(&self, at: Instant, total: u64) -> f64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            None => {
                *state = Some(Sample {
                    at,
                    total,
                    rate: 0.0,
                });
                0.0
            }
            Some(prev) if at.saturating_duration_since(prev.at) < MIN_SPAN => prev.rate,
            Some(prev) => {
                let span = at.saturating_duration_since(prev.at).as_secs_f64();
                let rate = total.saturating_sub(prev.total) as f64 / span;
                *state = Some(Sample { at, total, rate });
                rate
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_measured_between_samples_a_second_apart() {
        let meter = ThroughputMeter::default();
        let t0 = Instant::now();
        assert_eq!(meter.rate(t0, 100), 0.0);
        // Too soon: nothing measured yet.
        assert_eq!(meter.rate(t0 + Duration::from_millis(200), 150), 0.0);
        assert_eq!(meter.rate(t0 + Duration::from_secs(2), 300), 100.0);
        // Too soon again: the last rate stands.
        assert_eq!(meter.rate(t0 + Duration::from_millis(2500), 900), 100.0);
        assert_eq!(meter.rate(t0 + Duration::from_secs(6), 300), 0.0);
    }
}
