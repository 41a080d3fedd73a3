//! The server-wide speedup estimate behind the `tandem_spec_speedup_estimate` gauge.

use super::costs::CostModel;

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

    #[test]
    fn speedup_estimate_weighs_tokens_against_round_costs() {
        let mut c = CostModel::new(4);
        c.record_verify(0.010, 1);
        c.record_verify(0.015, 4);
        c.record_draft(0.002, (0.0, 0), 1, 1);
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
