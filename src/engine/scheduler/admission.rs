//! Requests in and out: queueing a checked request, admitting queued ones as KV capacity
//! allows, and giving a finished or cancelled request's resources back.

use std::time::Instant;

use kameo::message::{Context, Message};

use super::sequence::{Queued, Sequence};
use super::state::{record_finished, Scheduler};
use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::governor::Governor;
use crate::engine::messages::{EndSequence, FreeSlot, Release, Reserve, Submit};
use crate::engine::request::SpeculationStats;
use crate::sampling::SeededRng;
use crate::telemetry;

impl Scheduler {
    pub(super) async fn retire(&mut self, seq: Sequence) {
        let _ = self
            .cache
            .tell(Release {
                slot: seq.slot,
                tokens: seq.reserved,
            })
            .await;
        let _ = self.verifier.ask(FreeSlot { slot: seq.slot }).await;
        if let Some(d) = &self.drafter {
            let _ = d.ask(EndSequence { seq: seq.id }).await;
        }
    }

    /// Drops queued and active requests whose stream was dropped.
    pub(super) async fn retire_cancelled(&mut self) {
        self.queue.retain(|q| !q.events.is_closed());
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|s| s.events.is_closed());
        self.active = keep;
        for s in gone {
            record_finished("cancelled", &s);
            self.retire(s).await;
        }
    }

    pub(super) async fn admit(&mut self) {
        while self.active.len() < self.cfg.max_seqs {
            let Some(q) = self.queue.front() else { break };
            let g = &q.request.generation;
            let tokens =
                (g.prompt.len() + g.max_tokens + self.cfg.max_gamma + 1).min(self.cfg.context_len);
            let Ok(Some(slot)) = self.cache.ask(Reserve { tokens }).await else {
                break;
            };
            let q = self.queue.pop_front().expect("peeked");
            telemetry::record_admitted(q.request.generation.prompt.len());
            let seed = q
                .request
                .generation
                .sampling
                .seed
                .unwrap_or_else(|| SeededRng::from_entropy().next_u64());
            let group = self.active.iter().filter(|s| s.group == 0).count() > self.active.len() / 2;
            self.active.push(Sequence {
                id: q.id,
                slot,
                reserved: tokens,
                events: q.events,
                context: q.request.generation.prompt.clone(),
                prefilled: 0,
                emitter: Emitter::new(&q.request.generation),
                draft_rng: SeededRng::new(seed ^ 0x9E37_79B9_7F4A_7C15),
                accept_rng: SeededRng::new(seed),
                governor: Governor::with_prior(self.cfg.governor, self.acceptance.get()),
                spec: SpeculationStats::default(),
                group: usize::from(group),
                max_context: self.cfg.context_len,
                pending: None,
                drafter_seen: 0,
                arrived: q.arrived,
                admitted: Instant::now(),
                last_output: None,
                request: q.request,
            });
        }
    }
}

impl Message<Submit> for Scheduler {
    type Reply = Result<u64, EngineError>;

    /// Queues a request [`crate::engine::Engine::submit`] has checked; refuses it only when
    /// the queue is full.
    async fn handle(&mut self, msg: Submit, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        if self.queue.len() >= self.cfg.max_queue {
            return Err(EngineError::Overloaded {
                queued: self.queue.len(),
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Queued {
            id,
            arrived: Instant::now(),
            request: msg.request,
            events: msg.events,
        });
        telemetry::set_queue(self.active.len(), self.queue.len());
        self.schedule_step(ctx.actor_ref());
        Ok(id)
    }
}
