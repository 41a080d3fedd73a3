//! Requests in and out: queueing a checked request, admitting queued ones as KV capacity
//! allows, and giving a finished or cancelled request's resources back.

use std::time::Instant;

use kameo::message::{Context, Message};

use super::admitted::{Queued, Sequence};
use super::state::{record_finished, Scheduler};
use crate::engine::emitter::Emitter;
use crate::engine::error::EngineError;
use crate::engine::governor::Governor;
use crate::engine::messages::{
    Admission, Admit, CopyPrefix, DropRetained, EndSequence, FreeSlot, KeepSlot, PrefixStart,
    Release, Retain, Submit,
};
use crate::engine::request::SpeculationStats;
use crate::model::cache::prefix_index::common_prefix;
use crate::sampling::SeededRng;
use crate::telemetry;

impl Scheduler {
    /// Gives a sequence's resources back. With the prefix cache on and `keep` (it did not
    /// fail), its target slot is retained with the tokens its cache holds, for later prompts
    /// that start the same way; the drafter likewise keeps a draft model's cache.
    pub(super) async fn retire(&mut self, seq: Sequence, keep: bool) {
        let keep = keep && self.cfg.prefix_cache;
        let tokens = seq.cached_tokens();
        let freed = if keep && !tokens.is_empty() {
            let retained = self
                .cache
                .ask(Retain {
                    slot: seq.slot,
                    reserved: seq.reserved,
                    tokens: tokens.to_vec(),
                })
                .await;
            retained.unwrap_or_else(|e| {
                self.report_peer_error("cache manager", &e);
                vec![seq.slot]
            })
        } else {
            let released = self
                .cache
                .tell(Release {
                    slot: seq.slot,
                    tokens: seq.reserved,
                })
                .await;
            if let Err(e) = released {
                self.report_peer_error("cache manager", &e);
            }
            vec![seq.slot]
        };
        self.free_slots(freed).await;
        if let Some(d) = &self.drafter {
            let ended = d
                .ask(EndSequence {
                    seq: seq.id,
                    keep,
                    text: seq.context,
                })
                .await;
            if let Err(e) = ended {
                self.report_peer_error("drafter", &e);
            }
        }
    }

    /// Forgets every retained prefix, the target's and a draft model's.
    pub(super) async fn drop_retained(&mut self) {
        match self.cache.ask(DropRetained).await {
            Ok(slots) => self.free_slots(slots).await,
            Err(e) => self.report_peer_error("cache manager", &e),
        }
        if let Some(d) = &self.drafter {
            if let Err(e) = d.ask(DropRetained).await {
                self.report_peer_error("drafter", &e);
            }
        }
    }

    /// Forgets the caches of slots the ledger gave back.
    async fn free_slots(&mut self, slots: Vec<usize>) {
        for slot in slots {
            if let Err(e) = self.verifier.ask(FreeSlot { slot }).await {
                self.report_peer_error("verifier", &e);
            }
        }
    }

    /// Drops queued and active requests whose stream was dropped.
    pub(super) async fn retire_cancelled(&mut self) {
        self.queue.retain(|q| {
            let gone = q.events.iter().all(|e| e.is_closed());
            if gone {
                for _ in &q.events {
                    telemetry::record_finished(
                        "cancelled",
                        0,
                        0,
                        q.arrived.elapsed().as_secs_f64(),
                    );
                }
            }
            !gone
        });
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|s| s.events.is_closed());
        self.active = keep;
        for s in gone {
            record_finished("cancelled", &s);
            self.retire(s, true).await;
        }
    }

    /// Admits queued requests in order while slots and KV capacity last; a request's choices
    /// are admitted together or not at all.
    pub(super) async fn admit(&mut self) {
        while let Some(q) = self.queue.front() {
            let choices = q.events.len();
            if self.active.len() + choices > self.cfg.max_seqs {
                break;
            }
            let g = &q.request.generation;
            let tokens = (g.prompt.len())
                .saturating_add(g.max_tokens)
                .saturating_add(self.cfg.gamma_limit + 1)
                .min(self.cfg.context_len);
            let Some(admission) = self.reserve(tokens, choices).await else {
                break;
            };
            let cached = self
                .prepare_prefix(admission.prefix, admission.slots[0])
                .await;
            let q = self.queue.pop_front().expect("peeked");
            self.start_choices(q, admission.slots, cached, tokens);
        }
    }

    /// Asks the CacheManager for a slot per choice of the queue's first request, `tokens`
    /// reserved for each, and the best prefix to start from; frees the caches it evicted.
    /// `None`: not admitted now.
    async fn reserve(&mut self, tokens: usize, choices: usize) -> Option<Admission> {
        let q = self.queue.front()?;
        let prompt = q.request.generation.prompt.clone();
        // Prompt logprobs need every prompt row computed, so such a prompt starts afresh.
        let prefix_cache = self.cfg.prefix_cache && q.request.prompt_logprobs.is_none();
        let running = prefix_cache
            .then(|| {
                self.active
                    .iter()
                    .map(|s| (s.slot, common_prefix(s.cached_tokens(), &prompt)))
                    .max_by_key(|&(_, len)| len)
                    .filter(|&(_, len)| len > 0)
            })
            .flatten();
        let mut admission = match self
            .cache
            .ask(Admit {
                prompt,
                tokens,
                choices,
                prefix_cache,
                running,
            })
            .await
        {
            Ok(a) => a,
            Err(e) => {
                self.report_peer_error("cache manager", &e);
                return None;
            }
        };
        self.free_slots(std::mem::take(&mut admission.evicted))
            .await;
        (!admission.slots.is_empty()).then_some(admission)
    }

    /// The first choice's cache starts as the prefix: a retained slot cut to it, or a copy of
    /// a running sequence's. Returns the tokens it holds (0: it starts afresh).
    async fn prepare_prefix(&mut self, prefix: Option<(PrefixStart, usize)>, slot: usize) -> usize {
        let Some((start, len)) = prefix else {
            return 0;
        };
        let prepared = match start {
            PrefixStart::TakeOver => self.verifier.ask(KeepSlot { slot, len }).await.is_ok(),
            PrefixStart::CopyFrom(from) => self
                .verifier
                .ask(CopyPrefix {
                    from,
                    to: slot,
                    len,
                })
                .await
                .is_ok(),
        };
        if prepared {
            return len;
        }
        // Start afresh: an empty cache is always right.
        if let Err(e) = self.verifier.ask(FreeSlot { slot }).await {
            self.report_peer_error("verifier", &e);
        }
        0
    }

    /// A running sequence per choice of `q`, in `slots`, the first holding `cached` prompt
    /// tokens; each reserves `tokens`.
    fn start_choices(&mut self, mut q: Queued, slots: Vec<usize>, cached: usize, tokens: usize) {
        telemetry::record_admitted(q.request.generation.prompt.len());
        let choices = q.events.len();
        let live = self.settings.get();
        let seed = q
            .request
            .generation
            .sampling
            .seed
            .unwrap_or_else(|| SeededRng::from_entropy().next_u64());
        for (i, (events, slot)) in std::mem::take(&mut q.events)
            .into_iter()
            .zip(slots)
            .enumerate()
        {
            let permit = q.permits.split(1).expect("one permit per choice");
            let mut request = q.request.clone();
            // Choice i samples as a lone request seeded `seed + i` would.
            let seed = seed.wrapping_add(i as u64);
            request.generation.sampling.seed = Some(seed);
            let group = self.active.iter().filter(|s| s.group == 0).count() > self.active.len() / 2;
            let round = live.for_round(&request.speculative, self.queue.len());
            self.active.push(Sequence {
                id: q.id + i as u64,
                slot,
                reserved: tokens,
                events,
                context: request.generation.prompt.clone(),
                prefilled: if i == 0 { cached } else { 0 },
                emitter: Emitter::new(&request.generation),
                draft_rng: SeededRng::new(seed ^ 0x9E37_79B9_7F4A_7C15),
                accept_rng: SeededRng::new(seed),
                governor: Governor::starting_from(self.cfg.governor, &self.learned.acceptance),
                spec: SpeculationStats::default(),
                group: usize::from(group),
                max_context: self.cfg.context_len,
                pending: None,
                drafter_seen: 0,
                arrived: q.arrived,
                admitted: Instant::now(),
                last_output: None,
                prompt_logprobs: Vec::new(),
                waits_for: (i > 0).then_some(q.id),
                leads: i == 0 && choices > 1,
                cached: if i == 0 { cached } else { 0 },
                _permit: permit,
                constraint: request.constraint.as_ref().map(|c| c.start()),
                round_forced: 0,
                features: Vec::new(),
                round,
                request,
            });
        }
    }

    /// Starts the later choices of requests whose first choice has prefilled the prompt: each
    /// gets a copy of its cache but for the prompt's last token, which it feeds itself to
    /// sample its own first token. A choice whose first choice ended before that prefills the
    /// prompt on its own.
    pub(super) async fn start_waiting_choices(&mut self) -> Result<(), EngineError> {
        for i in 0..self.active.len() {
            let Some(leader) = self.active[i].waits_for else {
                continue;
            };
            let Some(l) = self.active.iter().position(|s| s.id == leader) else {
                self.active[i].waits_for = None;
                continue;
            };
            if !self.active[l].decoding() {
                continue;
            }
            let len = self.active[l].prompt_len() - 1;
            self.verifier
                .ask(CopyPrefix {
                    from: self.active[l].slot,
                    to: self.active[i].slot,
                    len,
                })
                .await
                .map_err(|e| EngineError::Worker(format!("verifier: {e}")))?;
            let logprobs = self.active[l].prompt_logprobs.clone();
            let s = &mut self.active[i];
            s.prefilled = len;
            s.prompt_logprobs = logprobs;
            s.waits_for = None;
        }
        for s in &mut self.active {
            // Every choice waiting for it was started above.
            if s.leads && s.decoding() {
                s.leads = false;
                s.prompt_logprobs.clear();
            }
        }
        Ok(())
    }
}

impl Message<Submit> for Scheduler {
    type Reply = Result<u64, EngineError>;

    /// Queues a request [`crate::engine::Engine::submit`] has checked and made room for (its
    /// capacity permits: the queue cannot overflow here).
    async fn handle(&mut self, msg: Submit, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        if msg.events.is_empty() || msg.events.len() > self.cfg.max_seqs {
            return Err(EngineError::InvalidRequest(format!(
                "a request may have 1 to {} choices (engine.max_seqs), not {}",
                self.cfg.max_seqs,
                msg.events.len()
            )));
        }
        let id = self.next_id;
        self.next_id += msg.events.len() as u64;
        self.queue.push_back(Queued {
            id,
            arrived: Instant::now(),
            request: msg.request,
            events: msg.events,
            permits: msg.permits,
        });
        telemetry::set_queue(self.active.len(), self.queue.len());
        self.liveness.work_changed(self.work());
        self.schedule_step(ctx.actor_ref());
        Ok(id)
    }
}
