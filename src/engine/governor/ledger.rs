//! What drafting has gained the server lately, net of what it cost: the budget that hope
//! (probes and catch-ups priced above a request's own acceptance estimate) may spend.
//!
//! Why it exists: the planner drafts where a forecast says it pays, and explores where it
//! might: a probe after plain steps, a fresh request's first drafts after its drafter takes in
//! the prompt. Exploring is an investment priced on hope, and with a drafter that is dear next
//! to its target (SmolLM2-135M costs half a step of Gemma-3-270M) and rarely right enough
//! (sampled text), every probe is a loss: a catch-up on a 200-token prompt costs ten plain
//! steps. No forecast can tell beforehand; the outcome can. The ledger keeps the seconds that
//! rounds which drafted saved against plain decoding, decayed over a minute of decoding, and
//! while it stands more than a small budget behind, exploring is priced at face value (a
//! request's own estimate) instead of on hope: where drafting pays, it never binds; where
//! nothing pays, hope costs about [`DraftingLedger::BUDGET`] of the decoding time at most.

/// Net seconds that drafting saved against plain decoding, decayed per second of decoding.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct DraftingLedger {
    net: f64,
}

impl DraftingLedger {
    /// Seconds of decoding over which what drafting gained or lost fades by e.
    pub const MEMORY_SECONDS: f64 = 60.0;
    /// The share of decoding time hope may cost beyond what drafting gained: the ledger may
    /// stand this far behind, over its memory, before exploring is priced at face value
    /// (0.3 s: a few probes), and it recovers at this share of the time meanwhile.
    pub const BUDGET: f64 = 0.005;

    /// A decoding round of `seconds` in which drafting saved `gain` seconds against plain
    /// decoding (negative: it cost that much more; 0 for a round that drafted nothing).
    pub fn record(&mut self, seconds: f64, gain: f64) {
        if !(seconds.is_finite() && seconds >= 0.0 && gain.is_finite()) {
            return;
        }
        self.net = self.net * (-seconds / Self::MEMORY_SECONDS).exp() + gain;
    }

    /// Net seconds saved lately (negative: lost).
    pub fn net(&self) -> f64 {
        self.net
    }

    /// Whether hope may spend: the ledger stands no further behind than the budget.
    pub fn may_explore(&self) -> bool {
        self.net >= -Self::BUDGET * Self::MEMORY_SECONDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_stop_exploring_until_decoding_time_wears_them_down() {
        let mut l = DraftingLedger::default();
        assert!(l.may_explore(), "nothing lost yet");
        // Probes losing 50 ms each, between 16 plain steps of 12 ms.
        let mut probes = 0;
        while l.may_explore() {
            l.record(0.06, -0.05);
            for _ in 0..16 {
                l.record(0.012, 0.0);
            }
            probes += 1;
        }
        assert!((6..=8).contains(&probes), "{probes} probes");
        // It waits while the loss fades: about 0.5% of the time goes back into exploring.
        let mut waited = 0.0;
        while !l.may_explore() {
            l.record(0.012, 0.0);
            waited += 0.012;
        }
        assert!((5.0..=20.0).contains(&waited), "{waited} s");
        // Gains pay for exploring: a drafter that saves more than its misses cost is never
        // held back by them.
        let mut l = DraftingLedger::default();
        for _ in 0..100 {
            l.record(0.04, 0.08);
            l.record(0.1, -0.05);
        }
        assert!(l.may_explore() && l.net() > 0.0);
        // A broken clock teaches nothing.
        l.record(f64::NAN, -1.0);
        l.record(0.01, f64::INFINITY);
        assert!(l.net() > 0.0 && l.net().is_finite());
    }
}
