//! Where a round's time went: how long both workers were busy at once (pipelining's overlap),
//! and the governor's forecast set against what the round measured. Kept apart from the
//! scheduling so the round's logic does not mix with its clocks.

use crate::draft::DraftTiming;
use crate::engine::governor::RoundForecast;

/// Seconds both workers were busy at once, and seconds at least one was.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Overlap {
    both_busy: f64,
    any_busy: f64,
}

impl Overlap {
    /// A round whose target forward and drafting ahead ran side by side for `wall` seconds:
    /// the verifier busy `target` of them, the drafter `ahead`.
    pub fn record(&mut self, wall: f64, target: f64, ahead: f64) {
        self.any_busy += wall;
        self.both_busy += (target + ahead - wall).clamp(0.0, wall);
    }

    /// Time both were busy over time at least one was (0 before any round).
    pub fn ratio(&self) -> f64 {
        if self.any_busy > 0.0 {
            self.both_busy / self.any_busy
        } else {
            0.0
        }
    }
}

/// What a round measured, part by part, beside its forecast.
pub(super) struct RoundTimes {
    pub draft: DraftTiming,
    pub verify_seconds: f64,
    /// A mixture's target: the distinct experts each routed layer read in the forward.
    pub expert_reads: Vec<u16>,
    /// Constrained sequences' grammar work (drafts checked, forced tokens, masks).
    pub mask_seconds: f64,
    pub round_seconds: f64,
}

/// Logs the forecast against measurement, part by part: what the governor's plans rest on.
pub(super) fn log_forecast(f: &RoundForecast, t: &RoundTimes, drafting_net: f64) {
    tracing::debug!(
        width = f.width,
        drafting = f.drafting,
        steps = f.steps,
        expected_tokens = f.tokens,
        forecast_draft_ms = f.draft * 1e3,
        draft_ms = t.draft.step_seconds * 1e3,
        first_step_ms = t.draft.first_step_seconds * 1e3,
        first_step_tokens = t.draft.first_step_tokens,
        forecast_catch_up_ms = f.catch_up * 1e3,
        catch_up_ms = t.draft.catch_up_seconds * 1e3,
        catch_up_tokens = t.draft.catch_up_tokens,
        forecast_verify_ms = f.verify * 1e3,
        verify_ms = t.verify_seconds * 1e3,
        experts_read = t.expert_reads.iter().map(|&r| r as usize).sum::<usize>(),
        mask_ms = t.mask_seconds * 1e3,
        round_ms = t.round_seconds * 1e3,
        drafting_bias = f.bias,
        drafting_net_ms = drafting_net * 1e3,
        "round"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_counts_only_time_both_workers_were_busy() {
        let mut o = Overlap::default();
        assert_eq!(o.ratio(), 0.0);
        // 10 ms of wall time, verifier 8 ms and drafter 6 ms: 4 ms side by side.
        o.record(0.010, 0.008, 0.006);
        assert!((o.ratio() - 0.4).abs() < 1e-9);
        // Nothing drafted ahead: no overlap, more wall time.
        o.record(0.010, 0.010, 0.0);
        assert!((o.ratio() - 0.2).abs() < 1e-9);
    }
}
