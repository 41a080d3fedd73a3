//! A memory budget for code the server runs on behalf of a file or a client (a chat template's
//! render): the process's allocator counts what a budgeted thread holds, and a thread that
//! asks for more than its budget is stopped where it stands.
//!
//! Why it exists: minijinja bounds a template's steps (fuel), not its memory, and a few steps
//! can take any amount (`{% set ns.s = ns.s ~ ns.s %}` in a loop doubles a string each step):
//! one such render would take the whole machine. An allocator cannot fail an allocation
//! gracefully (Rust aborts the process) nor unwind, so a thread past its budget is parked for
//! good instead: it keeps what it holds (at most its budget) and takes nothing more; its
//! caller stops waiting at its deadline, and [`stopped_threads`] counts it so the caller can
//! tell why and stop running such work once too many are parked.
//!
//! [`BudgetedAllocator`] is the binary's global allocator; without it (library tests) budgets
//! are not enforced.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

thread_local! {
    /// Bytes this thread may hold while budgeted (`usize::MAX`: unbudgeted).
    static LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Bytes this thread allocated and has not freed since its budget began.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

static STOPPED: AtomicUsize = AtomicUsize::new(0);

/// Threads parked for good for asking past their budget.
pub fn stopped_threads() -> usize {
    STOPPED.load(Ordering::Relaxed)
}

/// Runs `f` on this thread with at most `bytes` more held than when it began; past that, the
/// thread parks for good inside the allocation that went over.
pub fn with_budget<T>(bytes: usize, f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(usize::MAX));
        }
    }
    HELD.with(|h| h.set(0));
    LIMIT.with(|l| l.set(bytes));
    let _restore = Restore;
    f()
}

/// Counts `more` bytes against this thread's budget; whether they fit.
fn admit(more: usize) -> bool {
    let limit = LIMIT.with(Cell::get);
    if limit == usize::MAX {
        return true;
    }
    let held = HELD.with(Cell::get).saturating_add(more);
    HELD.with(|h| h.set(held));
    held <= limit
}

fn release(less: usize) {
    if LIMIT.with(Cell::get) != usize::MAX {
        HELD.with(|h| h.set(h.get().saturating_sub(less)));
    }
}

/// Parks the thread for good. Sleeping allocates nothing, so this cannot recurse.
fn stop() -> ! {
    STOPPED.fetch_add(1, Ordering::Relaxed);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The system allocator, with per-thread budgets ([`with_budget`]).
pub struct BudgetedAllocator;

unsafe impl GlobalAlloc for BudgetedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            stop();
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            stop();
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        release(layout.size());
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            if !admit(new_size - layout.size()) {
                stop();
            }
        } else {
            release(layout.size() - new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_what_the_thread_holds_and_ends_with_its_work() {
        std::thread::spawn(|| {
            with_budget(1000, || {
                assert!(admit(600));
                release(600);
                assert!(admit(900), "freed bytes are free again");
                assert!(!admit(200), "past the budget");
            });
            assert!(admit(usize::MAX / 2), "unbudgeted again after");
        })
        .join()
        .unwrap();
    }
}
