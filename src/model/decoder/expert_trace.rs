//! Which experts a mixture's routed layers chose, forward by forward: the router's decisions
//! made visible, for the tests that hold them to transformers' and for the benchmarks that
//! count the distinct experts a verification reads; and, alone, how many distinct experts each
//! routed layer read, which the engine's governor prices a verification by. Off by default;
//! when off, a routed layer pays a thread-local check. Per thread: the forwards the recording
//! thread runs itself are recorded, whatever other threads run meanwhile.

use std::cell::RefCell;

use crate::model::decoder::routing::Choice;

thread_local! {
    static ROUTES: RefCell<Option<Vec<LayerRoutes>>> = const { RefCell::new(None) };
    static READS: RefCell<Option<Vec<u16>>> = const { RefCell::new(None) };
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

/// Starts counting, on this thread, the distinct experts each routed layer reads (what was
/// counted before is dropped; the buffer is kept).
pub fn count_reads() {
    READS.with(|r| r.borrow_mut().get_or_insert_with(Vec::new).clear());
}

/// The distinct experts each routed layer read since counting started or the last take, in
/// the order the layers ran, into `out` (cleared first; its buffer and the thread's swap, so
/// a caller that takes after every forward allocates nothing). Empty when not counting.
pub fn take_reads(out: &mut Vec<u16>) {
    out.clear();
    READS.with(|r| {
        if let Some(reads) = r.borrow_mut().as_mut() {
            std::mem::swap(reads, out);
        }
    });
}

/// A routed layer read `distinct` experts, when this thread counts.
pub(crate) fn note_reads(distinct: impl FnOnce() -> usize) {
    READS.with(|r| {
        if let Some(reads) = r.borrow_mut().as_mut() {
            reads.push(distinct().min(u16::MAX as usize) as u16);
        }
    });
}
