//! One measured price: the least of a short window of measurements (see [`CostEstimate`]).

/// A measured cost: the least of the last few measurements. Timing noise on a shared machine
/// only ever adds (preemption, another process's burst can turn a 40 µs forward into 5 ms),
/// so the minimum of a short window tracks the real cost, and the window lets it follow slow
/// drifts such as attention growing with the context. (A median would hold a deep-context
/// price after long prompts for rounds the planner then declines to draft, so the price would
/// never be re-measured.)
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CostEstimate {
    recent: [f64; Self::WINDOW],
    pub(super) len: usize,
    next: usize,
    /// Holds only start-up measurements, which the first live one replaces.
    pub(super) provisional: bool,
}

impl CostEstimate {
    const WINDOW: usize = 8;

    pub fn record(&mut self, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        if std::mem::take(&mut self.provisional) {
            self.len = 0;
            self.next = 0;
        }
        self.recent[self.next] = seconds;
        self.next = (self.next + 1) % Self::WINDOW;
        self.len = (self.len + 1).min(Self::WINDOW);
    }

    pub fn get(&self) -> Option<f64> {
        self.recent[..self.len].iter().copied().reduce(f64::min)
    }
}
