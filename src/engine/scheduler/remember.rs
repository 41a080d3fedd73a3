//! Keeping what the governor learned for the next start, as requests finish.

use std::time::Instant;

use super::state::Scheduler;
use crate::engine::governor::Remembered;

impl Scheduler {
    /// Saves the prices and acceptance learned so far, when a save is due (the first request's
    /// end, then at most every half minute): a process may be stopped at any time, and
    /// `tandem generate` ends after its one request.
    pub(super) fn remember_learning(&mut self) {
        let learned = &mut self.learned;
        let Some(memory) = learned.memory.as_mut() else {
            return;
        };
        let now = Instant::now();
        if !memory.due(now) {
            return;
        }
        let snapshot = Remembered {
            costs: learned.costs.to_remember(),
            reference: memory.reference().to_vec(),
            acceptance: learned.acceptance,
            chain_rates: learned.chain_rates.clone(),
            branch_rates: learned.branch_rates.clone(),
        };
        memory.save(&snapshot, now);
    }
}
