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
    Admit, ClearPrefixCache, CopyPrefix, EndSequence, FreeSlot, PrefixReport, Release,
    StartFromPrefix, StorePrefix, Submit,
};
use crate::engine::request::SpeculationStats;
use crate::model::cache::prefix_store::{common_prefix, PrefixStoreStats};
use crate::sampling::SeededRng;
use crate::telemetry;

impl Scheduler {
    /// Gives a sequence's resources back. With the prefix cache on and `keep` (it did not
    /// fail), what its target slot holds is stored in the prefix cache for later prompts that
    /// start the same way; the drafter likewise stores a draft model's.
    pub(super) async fn retire(&mut self, seq: Sequence, keep: bool) {
        let keep = keep && self.cfg.prefix_cache;
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
        let tokens = seq.cached_tokens();
        if keep && !tokens.is_empty() {
            let stored = self
                .verifier
                .ask(StorePrefix {
                    slot: seq.slot,
                    scope: seq.request.generation.cache_scope,
                    tokens: tokens.to_vec(),
                })
                .await;
            match stored {
                Ok(store) => self.report_prefix(0, 0, store).await,
                Err(e) => {
                    self.report_peer_error("verifier", &e);
                    self.free_slot(seq.slot).await;
                }
            }
        } else {
            self.free_slot(seq.slot).await;
        }
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
        self.remember_learning();
    }

    /// Forgets everything the prefix cache holds, the target's and a draft model's.
    pub(super) async fn clear_prefix_cache(&mut self) {
        match self.verifier.ask(ClearPrefixCache).await {
            Ok(store) => self.report_prefix(0, 0, store).await,
            Err(e) => self.report_peer_error("verifier", &e),
        }
        if let Some(d) = &self.drafter {
            if let Err(e) = d.ask(ClearPrefixCache).await {
                self.report_peer_error("drafter", &e);
            }
        }
    }

    /// Tells the ledger of a prefix lookup (`queried` prompt tokens, `hit` of them cached) and
    /// what the target's store holds now.
    async fn report_prefix(&mut self, queried: usize, hit: usize, store: PrefixStoreStats) {
        let told = self
            .cache
            .tell(PrefixReport {
                queried,
                hit,
                store,
            })
            .await;
        if let Err(e) = told {
            self.report_peer_error("cache manager", &e);
        }
    }

    /// Forgets the cache of a slot the ledger took back.
    async fn free_slot(&mut self, slot: usize) {
        if let Err(e) = self.verifier.ask(FreeSlot { slot }).await {
            self.report_peer_error("verifier", &e);
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
            let admitted = self.cache.ask(Admit { tokens, choices }).await;
            let slots = match admitted {
                Ok(a) if !a.slots.is_empty() => a.slots,
                Ok(_) => break,
                Err(e) => {
                    self.report_peer_error("cache manager", &e);
                    break;
                }
            };
            let cached = self.start_from_prefix(slots[0]).await;
            let q = self.queue.pop_front().expect("peeked");
            self.start_choices(q, slots, cached, tokens);
        }
    }

    /// The queue's first request's first choice starts in `slot` from the longest start of its
    /// prompt that the prefix cache or a running sequence holds (the prompt's last token is
    /// always fed, to sample from). Returns the tokens its cache holds (0: it starts afresh).
    async fn start_from_prefix(&mut self, slot: usize) -> usize {
        let Some(q) = self.queue.front() else {
            return 0;
        };
        // Prompt logprobs need every prompt row computed, so such a prompt starts afresh.
        if !self.cfg.prefix_cache || q.request.prompt_logprobs.is_some() {
            return 0;
        }
        let prompt = q.request.generation.prompt.clone();
        let scope = q.request.generation.cache_scope;
        let running = self
            .active
            .iter()
            .filter(|s| s.request.generation.cache_scope == scope)
            .map(|s| (s.slot, common_prefix(s.cached_tokens(), &prompt)))
            .max_by_key(|&(_, len)| len)
            .filter(|&(_, len)| len > 0);
        let queried = prompt.len();
        let started = self
            .verifier
            .ask(StartFromPrefix {
                slot,
                scope,
                limit: queried.saturating_sub(1),
                prompt,
                running,
            })
            .await;
        let (len, store) = match started {
            Ok(p) => (p.len, Some(p.store)),
            Err(e) => {
                // Start afresh: an empty cache is always right.
                self.report_peer_error("verifier", &e);
                self.free_slot(slot).await;
                (0, None)
            }
        };
        telemetry::record_prefix_lookup("target", queried, len);
        if let Some(store) = store {
            self.report_prefix(queried, len, store).await;
        }
        len
    }

    /// A running sequence per choice of `q`, in `slots`, the first holding `cached` prompt
    /// tokens; each reserves `tokens`.
    fn start_choices(&mut self, mut q: Queued, slots: Vec<usize>, cached: usize, tokens: usize) {
        telemetry::record_admitted(q.request.generation.prompt.len());
        let choices = q.events.len();
        let live = self.settings.get();
        // Rehearsed once for all the choices: they share the prompt.
        let rehearsal = self
            .cfg
            .foresight
            .as_ref()
            .map(|f| f.rehearse(&q.request.generation.prompt));
        tracing::debug!(id = q.id, ?rehearsal, "prompt rehearsed");
        let class = self
            .learned
            .acceptance
            .class(&q.request.generation.sampling);
        let coverage = self
            .cfg
            .coverage
            .as_ref()
            .and_then(|c| c.of(&q.request.generation.prompt, &class.coverage));
        tracing::debug!(id = q.id, ?coverage, "prompt coverage");
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
                governor: Governor::starting_from(
                    self.cfg.governor,
                    self.learned.acceptance.class(&request.generation.sampling),
                    rehearsal.as_ref(),
                    coverage,
                ),
                spec: SpeculationStats::default(),
                group: usize::from(group),
                max_context: self.cfg.context_len,
                pending: None,
                drafter_seen: 0,
                drafter_tokens: Default::default(),
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
