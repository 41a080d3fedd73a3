//! Whether the engine still makes progress, told without asking the engine.
//!
//! Why it exists: a scheduler that stops running rounds (a lost wake-up, a worker stuck in a
//! kernel, a panicked actor) answers no message, so nothing that asks it can notice. The
//! scheduler stamps this shared record instead (how much work it holds, when it last made
//! progress) and the watchdog, `/health` and the metrics read it from outside: work waiting
//! with no round for longer than `engine.stall_timeout_seconds` is a stalled engine, which
//! `/health` reports as 503 so a fleet routes around the replica and an orchestrator restarts it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The scheduler's heartbeat, shared with whoever watches it.
#[derive(Debug)]
pub struct Liveness {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last progress: a round's end, or work arriving at an
    /// idle engine.
    last_progress_ms: AtomicU64,
    /// Sequences queued or running.
    work: AtomicUsize,
    /// The scheduler stopped for good (its actor ended).
    dead: AtomicBool,
    /// The engine was dropped: its scheduler ending is a shutdown, not a death.
    shut_down: AtomicBool,
    /// The last forward that reported on its logits found them NaN or infinite (not by a
    /// request's settings): the model's numbers are broken until a forward is sound again.
    logits_broken: AtomicBool,
    timeout: Option<Duration>,
}

/// What the watchdog sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EngineHealth {
    /// Idle, or the last round ended within the timeout.
    Ok,
    /// Work is waiting and no round has ended for this long (past the timeout).
    Stalled { since: Duration, waiting: usize },
    /// The scheduler is gone; nothing will run again.
    Dead,
}

impl Liveness {
    /// `timeout`: how long work may wait for a round before the engine counts as stalled
    /// (`None`: never).
    pub fn new(timeout: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            work: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            logits_broken: AtomicBool::new(false),
            timeout,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    // The scheduler is the only writer. It stamps the time before it publishes the work
    // (Release), and readers take the work first (Acquire): a reader that sees new work
    // always sees the time that came with it, never work beside an old time.

    /// A round ended; `work` sequences remain.
    pub fn round_ended(&self, work: usize) {
        self.last_progress_ms
            .store(self.now_ms(), Ordering::Release);
        self.work.store(work, Ordering::Release);
    }

    /// The scheduler now holds `work` sequences (between rounds). Work arriving at an idle
    /// engine starts the clock; more work arriving at a busy one does not reset it.
    pub fn work_changed(&self, work: usize) {
        if self.work.load(Ordering::Relaxed) == 0 && work > 0 {
            self.last_progress_ms
                .store(self.now_ms(), Ordering::Release);
        }
        self.work.store(work, Ordering::Release);
    }

    /// A sequence's forward gave finite logits (`true`), or NaN or infinite ones through no
    /// setting of its request (`false`).
    pub fn forward_was_finite(&self, finite: bool) {
        self.logits_broken.store(!finite, Ordering::Relaxed);
    }

    /// Whether the last forward's logits were broken.
    pub fn logits_broken(&self) -> bool {
        self.logits_broken.load(Ordering::Relaxed)
    }

    pub fn mark_dead(&self) {
        self.dead.store(true, Ordering::Relaxed);
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// The engine is being dropped: the watchdog ends quietly.
    pub fn mark_shut_down(&self) {
        self.shut_down.store(true, Ordering::Relaxed);
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Relaxed)
    }

    /// Time since the last progress while work waits; zero while idle.
    pub fn round_age(&self) -> Duration {
        if self.work.load(Ordering::Acquire) == 0 {
            return Duration::ZERO;
        }
        let last = self.last_progress_ms.load(Ordering::Acquire);
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    pub fn health(&self) -> EngineHealth {
        if self.dead.load(Ordering::Relaxed) {
            return EngineHealth::Dead;
        }
        let age = self.round_age();
        match self.timeout {
            Some(t) if age > t => EngineHealth::Stalled {
                since: age,
                waiting: self.work.load(Ordering::Acquire),
            },
            _ => EngineHealth::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_healthy_and_waiting_work_stalls_after_the_timeout() {
        let l = Liveness::new(Some(Duration::from_millis(30)));
        assert_eq!(l.health(), EngineHealth::Ok);
        std::thread::sleep(Duration::from_millis(50));
        // Idle for longer than the timeout is still healthy.
        assert_eq!(l.health(), EngineHealth::Ok);
        l.work_changed(3);
        assert_eq!(l.health(), EngineHealth::Ok);
        std::thread::sleep(Duration::from_millis(50));
        // More work arriving does not hide the stall.
        l.work_changed(4);
        assert!(
            matches!(l.health(), EngineHealth::Stalled { waiting: 4, since } if since >= Duration::from_millis(30))
        );
        l.round_ended(4);
        assert_eq!(l.health(), EngineHealth::Ok);
        l.round_ended(0);
        assert_eq!(l.round_age(), Duration::ZERO);
        l.mark_dead();
        assert_eq!(l.health(), EngineHealth::Dead);
    }

    #[test]
    fn no_timeout_never_stalls() {
        let l = Liveness::new(None);
        l.work_changed(1);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(l.health(), EngineHealth::Ok);
        assert!(l.round_age() > Duration::ZERO);
    }
}
