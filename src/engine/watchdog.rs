//! The watchdog: a task beside the engine that reads its [`Liveness`] and says, loudly and
//! once per stall, when work waits and no round runs.
//!
//! Why it exists: `/health` reads the same record on every probe, but a stall nobody probes
//! must still reach the logs and the metrics (`tandem_engine_stalls_total`,
//! `tandem_engine_round_age_seconds`), and a scheduler actor that ended must be noticed even
//! when no request asks it anything.

use std::sync::{Arc, Weak};
use std::time::Duration;

use kameo::actor::WeakActorRef;

use super::liveness::{EngineHealth, Liveness};
use super::scheduler::Scheduler;
use crate::telemetry;

/// Watches until the engine is dropped.
pub(super) fn spawn(liveness: &Arc<Liveness>, scheduler: WeakActorRef<Scheduler>) {
    let period = liveness.timeout().map_or(Duration::from_secs(1), |t| {
        (t / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    });
    let liveness: Weak<Liveness> = Arc::downgrade(liveness);
    tokio::spawn(async move {
        let mut stalled = false;
        loop {
            tokio::time::sleep(period).await;
            let Some(l) = liveness.upgrade() else {
                return;
            };
            if l.is_shut_down() {
                return;
            }
            if scheduler.upgrade().is_none_or(|s| !s.is_alive()) {
                l.mark_dead();
            }
            telemetry::set_round_age(l.round_age().as_secs_f64());
            telemetry::set_engine_stalled(l.health() != EngineHealth::Ok);
            match l.health() {
                EngineHealth::Ok if stalled => {
                    stalled = false;
                    tracing::warn!("engine progressing again after a stall");
                }
                EngineHealth::Ok => {}
                EngineHealth::Stalled { since, waiting } if !stalled => {
                    stalled = true;
                    telemetry::record_engine_stall();
                    tracing::error!(
                        waiting,
                        seconds_without_round = since.as_secs_f64(),
                        "ENGINE STALLED: work is waiting and no round has run; /health now answers 503"
                    );
                }
                EngineHealth::Stalled { .. } => {}
                EngineHealth::Dead => {
                    if !stalled {
                        telemetry::record_engine_stall();
                        tracing::error!(
                            "ENGINE STOPPED: the scheduler has ended; /health now answers 503"
                        );
                    }
                    return;
                }
            }
        }
    });
}
