//! Which experts a mixture's routed layers chose, forward by forward: the router's decisions
//! made visible, for the tests that hold them to transformers' and for the benchmarks that
//! count the distinct experts a verification reads. Off by default; when off, a routed layer
//! pays one thread-local check. Per thread: the forwards the recording thread runs itself are
//! recorded, whatever other threads run meanwhile.

use std::cell::RefCell;

use crate::model::decoder::routing::Choice;

thread_local! {
    static ROUTES: RefCell<Option<Vec<LayerRoutes>>> = const { RefCell::new(None) };
}

/// One routed layer's choices in one forward: per row, its experts, the largest router
/// probability first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRoutes {
    pub rows: Vec<Vec<u32>>,
}

impl LayerRoutes {
    /// The distinct experts the rows read: each one's weights are read once.
    pub fn distinct(&self) -> usize {
        let mut all: Vec<u32> = self.rows.iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }
}

/// Starts (or stops) recording on this thread; starting clears what was recorded.
pub fn record(on: bool) {
    ROUTES.with(|r| *r.borrow_mut() = on.then(Vec::new));
}

/// What this thread recorded since the last take, routed layers in the order they ran (a
/// forward's layers first to last, then the next forward's).
pub fn take() -> Vec<LayerRoutes> {
    ROUTES.with(|r| {
        r.borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    })
}

/// A routed layer's choices, `used` per row, when this thread records.
pub(crate) fn note(choices: &[Choice], used: usize) {
    ROUTES.with(|r| {
        if let Some(routes) = r.borrow_mut().as_mut() {
            let rows = choices
                .chunks_exact(used)
                .map(|row| row.iter().map(|c| c.expert).collect())
                .collect();
            routes.push(LayerRoutes { rows });
        }
    });
}
