//! The Scheduler actor: admission, rounds, per-request state and streams, stop conditions and
//! retirement. It knows nothing of tensors: each round it asks the Drafter for drafts and the
//! Verifier for one batched target forward, then turns the outcomes into output events.
//!
//! Continuous batching: requests join (admitted from the queue) and leave (finished or
//! cancelled) between rounds; prompts are prefilled in chunks of at most `prefill_chunk` tokens
//! per round, inside the same forward as everyone else's decoding. With `pipeline` on, decoding
//! sequences are split into two groups: while the verifier checks one group's drafts, the
//! drafter drafts for the other (DESIGN.md §4). While only one group has decoding sequences (a
//! lone request, say), it is verified every round, and the drafter drafts each sequence's next
//! round during the verification, assuming every draft stands and guessing the target's token
//! after them; the guess is used when both held and discarded otherwise.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kameo::actor::ActorRef;
use kameo::error::Infallible;
use kameo::message::{Context, Message};
use kameo::Actor;
use tokio::sync::mpsc;

use super::cache_manager::CacheManager;
use super::drafter::Drafter;
use super::emitter::Emitter;
use super::governor::{
    forecast_round, plan_round, AcceptanceRate, Candidate, Choice, CostModel, Governor,
    GovernorConfig, RoundForecast, SpeedupEstimate,
};

/// Weight of the past in the server-wide acceptance rate, per drafted token (≈ the last few
/// hundred drafts of any request).
const POOLED_ACCEPTANCE_DECAY: f64 = 0.995;
use super::messages::*;
use super::plain::{check_request, FinishReason};
use super::settings::{LiveSettings, SpeculationSettings};
use super::speculative::SpecStats;
use super::verifier::Verifier;
use super::EngineError;
use crate::draft::{DraftTiming, Proposal};
use crate::sampling::SeededRng;
use crate::telemetry;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_seqs: usize,
    pub max_queue: usize,
    pub prefill_chunk: usize,
    pub pipeline: bool,
    pub context_len: usize,
    /// The largest γ any round may draft (KV headroom is reserved for it).
    pub max_gamma: usize,
    pub governor: GovernorConfig,
}

struct Queued {
    id: u64,
    request: EngineRequest,
    events: mpsc::UnboundedSender<EngineEvent>,
    arrived: Instant,
}

/// One admitted request.
struct Sequence {
    id: u64,
    slot: usize,
    reserved: usize,
    events: mpsc::UnboundedSender<EngineEvent>,
    request: EngineRequest,
    /// Prompt and output so far; while decoding, its last token is not yet in the target cache.
    context: Vec<u32>,
    prefilled: usize,
    emitter: Emitter,
    draft_rng: SeededRng,
    accept_rng: SeededRng,
    governor: Governor,
    spec: SpecStats,
    /// Pipelining group (0 or 1).
    group: usize,
    /// The context limit: a sequence whose context reaches it ends (`ContextFull`).
    max_context: usize,
    /// Drafts made in an earlier step, waiting for verification (pipelining).
    pending: Option<Proposal>,
    /// Context length when it last drafted (what a draft model's cache has seen, about).
    drafter_seen: usize,
    arrived: Instant,
    admitted: Instant,
    last_output: Option<Instant>,
}

impl Sequence {
    fn prompt_len(&self) -> usize {
        self.request.generation.prompt.len()
    }

    fn decoding(&self) -> bool {
        self.prefilled >= self.prompt_len()
    }

    /// How γ is set for the next round: the request's policy, capped so the verification fits
    /// the context and does not draft past `max_tokens`.
    fn candidate(
        &self,
        has_drafter: bool,
        context_len: usize,
        live: &SpeculationSettings,
    ) -> Candidate {
        let n = self.context.len() - 1;
        let room = context_len.saturating_sub(n + 1);
        let remaining = self.request.generation.max_tokens - self.emitter.generated();
        let cap = room.min(remaining.saturating_sub(1));
        let adaptive = || Candidate {
            depth: n,
            ..self.governor.candidate(
                live.gamma_min.min(cap),
                live.gamma_max.min(cap),
                self.context.len().saturating_sub(self.drafter_seen + 2),
                remaining,
            )
        };
        let fixed = |g: usize| Candidate {
            alpha: self.governor.alpha(),
            choice: Choice::Fixed(g.min(cap)),
            catch_up: 0,
            remaining,
            depth: n,
        };
        match self.request.gamma {
            _ if !has_drafter => fixed(0),
            GammaPolicy::Off => fixed(0),
            GammaPolicy::Fixed(g) => fixed(g),
            GammaPolicy::Adaptive => adaptive(),
            GammaPolicy::Server if !live.enabled => fixed(0),
            GammaPolicy::Server if live.adaptive => adaptive(),
            GammaPolicy::Server => fixed(live.gamma),
        }
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    verifier: ActorRef<Verifier>,
    drafter: Option<ActorRef<Drafter>>,
    cache: ActorRef<CacheManager>,
    settings: LiveSettings,
    queue: VecDeque<Queued>,
    active: Vec<Sequence>,
    next_id: u64,
    step_scheduled: bool,
    costs: CostModel,
    speedup: SpeedupEstimate,
    /// Every request's drafts together: where a new request's governor starts.
    acceptance: AcceptanceRate,
    rounds: u64,
    /// Seconds both workers were busy at once, and seconds at least one was.
    both_busy: f64,
    any_busy: f64,
    /// Next rounds drafted during a verification within a request, and how many were used.
    drafted_ahead: u64,
    ahead_used: u64,
}

impl Scheduler {
    pub fn new(
        cfg: SchedulerConfig,
        verifier: ActorRef<Verifier>,
        drafter: Option<ActorRef<Drafter>>,
        cache: ActorRef<CacheManager>,
        settings: LiveSettings,
        costs: CostModel,
    ) -> Self {
        Self {
            cfg,
            verifier,
            drafter,
            cache,
            settings,
            queue: VecDeque::new(),
            active: Vec::new(),
            next_id: 0,
            step_scheduled: false,
            costs,
            speedup: SpeedupEstimate::default(),
            acceptance: AcceptanceRate::new(0.5),
            rounds: 0,
            both_busy: 0.0,
            any_busy: 0.0,
            drafted_ahead: 0,
            ahead_used: 0,
        }
    }

    fn schedule_step(&mut self, me: &ActorRef<Self>) {
        let has_work = !self.active.is_empty() || !self.queue.is_empty();
        if has_work && !self.step_scheduled {
            self.step_scheduled = true;
            // The mailbox only ever holds one Step, so this cannot fill it.
            let _ = me.tell(Step).try_send();
        }
    }

    async fn retire(&mut self, seq: Sequence) {
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
    async fn retire_cancelled(&mut self) {
        self.queue.retain(|q| !q.events.is_closed());
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|s| s.events.is_closed());
        self.active = keep;
        for s in gone {
            telemetry::record_finished(
                "cancelled",
                s.spec.draft_tokens,
                s.spec.accepted_tokens,
                s.arrived.elapsed().as_secs_f64(),
            );
            self.retire(s).await;
        }
    }

    async fn admit(&mut self) {
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
                spec: SpecStats::default(),
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

    /// A draft of `s`'s next round made while `drafts` are verified: from its context with
    /// every draft standing, `gamma + 1` tokens, the first a guess of the token the target
    /// adds, so that a right guess leaves `gamma` drafts (fewer near the token or context
    /// limit). `None` when the next round could not draft any.
    fn draft_ahead_item(&self, s: &Sequence, drafts: &[u32], gamma: usize) -> Option<DraftItem> {
        // The next round verifies from context + drafts + guess: as `Sequence::candidate` caps
        // it.
        let n = s.context.len() + drafts.len();
        let room = self.cfg.context_len.saturating_sub(n + 1);
        let remaining = (s.request.generation.max_tokens - s.emitter.generated())
            .saturating_sub(drafts.len() + 1);
        let next = gamma.min(room).min(remaining.saturating_sub(1));
        if next == 0 {
            return None;
        }
        let mut item = self.draft_item(s, next + 1);
        item.context.extend_from_slice(drafts);
        Some(item)
    }

    fn draft_item(&self, s: &Sequence, gamma: usize) -> DraftItem {
        DraftItem {
            seq: s.id,
            context: s.context.clone(),
            prompt_len: s.prompt_len(),
            gamma,
            params: s.request.generation.sampling.clone(),
            rng: s.draft_rng.clone(),
        }
    }

    fn target_item(
        s: &Sequence,
        work: TargetWork,
        tokens: Vec<u32>,
        proposal: Proposal,
        default_lenience: f32,
    ) -> TargetItem {
        let start_pos = match work {
            TargetWork::Verify => s.context.len() - 1,
            _ => s.prefilled,
        };
        TargetItem {
            seq: s.id,
            slot: s.slot,
            start_pos,
            tokens,
            work,
            proposal,
            params: s.request.generation.sampling.clone(),
            lenience: s.request.lenience.unwrap_or(default_lenience),
            context: s.context.clone(),
            prompt_len: s.prompt_len(),
            rng: s.accept_rng.clone(),
        }
    }

    async fn draft(&self, items: Vec<DraftItem>) -> Result<DraftBatchResult, EngineError> {
        match (&self.drafter, items.is_empty()) {
            (Some(d), false) => d
                .ask(DraftBatch { items })
                .await
                .map_err(|e| EngineError::Worker(format!("drafter: {e}"))),
            _ => Ok(DraftBatchResult::default()),
        }
    }

    /// Stores drafts with their sequences and the drafting cost in the cost model; returns the
    /// seconds drafting took, and the drafts of the sequences in `held` (drafted ahead within
    /// a request: they wait for the verification of the round before).
    fn take_drafts(
        &mut self,
        drafts: DraftBatchResult,
        held: &[(u64, usize)],
    ) -> (f64, HashMap<u64, DraftOutcome>) {
        let t = drafts.timing;
        let mut kept = HashMap::new();
        self.costs.record_draft(
            t.step_seconds,
            t.first_step_seconds,
            t.steps,
            drafts.outcomes.len(),
        );
        self.costs
            .record_catch_up(t.catch_up_seconds, t.catch_up_tokens);
        for o in drafts.outcomes {
            if held.iter().any(|&(seq, _)| seq == o.seq) {
                kept.insert(o.seq, o);
                continue;
            }
            let Some(s) = self.active.iter_mut().find(|s| s.id == o.seq) else {
                continue;
            };
            s.draft_rng = o.rng;
            s.drafter_seen = s.context.len();
            // A drafter failure costs this round's speculation, not the request.
            s.pending = o.proposal.ok();
        }
        (t.step_seconds + t.catch_up_seconds, kept)
    }

    /// γ for each sequence in `which` (indices into `active`) for one round, with `base_width`
    /// other tokens in the same target forward, and what the plan is expected to cost.
    fn plan(
        &self,
        which: &[usize],
        base_width: usize,
        live: &SpeculationSettings,
    ) -> (Vec<usize>, Option<RoundForecast>) {
        let has_drafter = self.drafter.is_some();
        let candidates: Vec<Candidate> = which
            .iter()
            .map(|&i| self.active[i].candidate(has_drafter, self.cfg.context_len, live))
            .collect();
        let plan = plan_round(
            &candidates,
            base_width,
            &self.costs,
            self.cfg.governor.min_gain,
        );
        let forecast = forecast_round(&candidates, &plan, base_width, &self.costs);
        if has_drafter && !candidates.is_empty() {
            tracing::debug!(?candidates, ?plan, "plan");
        }
        (plan, forecast)
    }

    /// One round: prefill chunks, drafting and one batched target forward.
    async fn step(&mut self) -> Result<(), EngineError> {
        self.retire_cancelled().await;
        self.admit().await;
        if self.active.is_empty() {
            return Ok(());
        }
        let live = self.settings.get();
        let lenience = live.lenience_for_queue(self.queue.len());
        telemetry::set_speculation(lenience, live.gamma_gauge());
        let has_drafter = self.drafter.is_some();
        let pipelined = self.cfg.pipeline && has_drafter;
        // The groups alternate while both have decoding sequences; a lone group is verified
        // every round and drafts ahead within its own requests.
        let decoding_in = |g: usize| self.active.iter().any(|s| s.decoding() && s.group == g);
        let (in_0, in_1) = (decoding_in(0), decoding_in(1));
        let within = pipelined && !(in_0 && in_1);
        let verify_group = if within {
            usize::from(in_1 && !in_0)
        } else {
            (self.rounds % 2) as usize
        };

        // Which decoding sequences are verified now and which are drafted for later.
        let mut now = Vec::new();
        let mut ahead = Vec::new();
        for (i, s) in self.active.iter().enumerate() {
            if !s.decoding() || s.pending.is_some() {
                continue;
            }
            if !pipelined || within {
                now.push(i);
            } else if s.group != verify_group {
                ahead.push(i);
            }
        }
        // Prompt tokens that will share this round's target forward.
        let prefill_width = self
            .active
            .iter()
            .filter(|s| !s.decoding())
            .map(|s| s.prompt_len() - s.prefilled)
            .sum::<usize>()
            .min(self.cfg.prefill_chunk.max(1));
        let mut to_draft_now = Vec::new();
        let (plan_now, forecast) = self.plan(&now, prefill_width, &live);
        for (&i, gamma) in now.iter().zip(plan_now) {
            if gamma > 0 {
                to_draft_now.push(self.draft_item(&self.active[i], gamma));
            }
        }
        let mut to_draft_ahead = Vec::new();
        // Sequences drafting their next round during this verification, and their γ.
        let mut guesses: Vec<(u64, usize)> = Vec::new();
        for (&i, gamma) in ahead.iter().zip(self.plan(&ahead, 0, &live).0) {
            if gamma > 0 {
                to_draft_ahead.push(self.draft_item(&self.active[i], gamma));
            }
        }
        let round_start = Instant::now();
        let mut draft_secs = 0.0;
        let mut draft_timing = DraftTiming::default();
        if !to_draft_now.is_empty() {
            let drafts = self.draft(to_draft_now).await?;
            draft_timing = drafts.timing;
            draft_secs = self.take_drafts(drafts, &[]).0;
        }

        // The target batch: prompt chunks within the budget, then verifications.
        let mut items = Vec::new();
        let mut budget = self.cfg.prefill_chunk.max(1);
        for s in &mut self.active {
            if s.decoding() {
                if pipelined && s.group != verify_group {
                    continue;
                }
                let proposal = s.pending.take().unwrap_or_default();
                let gamma = proposal.tokens.len();
                if within && gamma > 0 {
                    guesses.push((s.id, gamma));
                }
                let mut tokens = Vec::with_capacity(1 + proposal.tokens.len());
                tokens.push(*s.context.last().expect("context holds the prompt"));
                tokens.extend_from_slice(&proposal.tokens);
                items.push(Self::target_item(
                    s,
                    TargetWork::Verify,
                    tokens,
                    proposal,
                    lenience,
                ));
            } else if budget > 0 {
                let end = (s.prefilled + budget).min(s.prompt_len());
                let chunk = s.request.generation.prompt[s.prefilled..end].to_vec();
                budget -= chunk.len();
                let work = if end == s.prompt_len() {
                    TargetWork::PrefillLast
                } else {
                    TargetWork::PrefillChunk
                };
                items.push(Self::target_item(
                    s,
                    work,
                    chunk,
                    Proposal::default(),
                    lenience,
                ));
            }
        }
        for &(seq, gamma) in &guesses {
            let item = items
                .iter()
                .find(|i| i.seq == seq)
                .map(|i| i.tokens[1..].to_vec())
                .and_then(|drafts| {
                    let s = self.active.iter().find(|s| s.id == seq)?;
                    self.draft_ahead_item(s, &drafts, gamma)
                });
            to_draft_ahead.extend(item);
        }
        let widths: Vec<(TargetWork, usize)> =
            items.iter().map(|i| (i.work, i.tokens.len())).collect();
        // What each sequence sent: its chunk length, or its drafts.
        let sent: HashMap<u64, (usize, Vec<u32>)> = items
            .iter()
            .map(|i| {
                let drafts = match i.work {
                    TargetWork::Verify => i.tokens[1..].to_vec(),
                    _ => Vec::new(),
                };
                (i.seq, (i.tokens.len(), drafts))
            })
            .collect();

        let wall = Instant::now();
        let verifier = self.verifier.clone();
        let target = async move {
            if items.is_empty() {
                return Ok(None);
            }
            verifier
                .ask(TargetBatch { items })
                .await
                .map(Some)
                .map_err(|e| EngineError::Worker(format!("verifier: {e}")))
        };
        let (target, ahead) = tokio::join!(target, self.draft(to_draft_ahead));
        let wall = wall.elapsed().as_secs_f64();
        // Drafts of a next round made during this one wait for its outcome.
        let (ahead_secs, mut guessed) = self.take_drafts(ahead?, &guesses);
        self.rounds += 1;
        let Some(result) = target? else {
            return Ok(());
        };
        self.any_busy += wall;
        self.both_busy += (result.seconds + ahead_secs - wall).clamp(0.0, wall);
        draft_secs += ahead_secs;
        let round_secs = round_start.elapsed().as_secs_f64();
        if let (Some(f), false) = (forecast, pipelined) {
            if f.drafting > 0 {
                self.costs
                    .record_draft_forecast(f.draft, draft_timing.step_seconds);
            }
            // Forecast against measurement, part by part: what the governor's plans rest on.
            tracing::debug!(
                width = f.width,
                drafting = f.drafting,
                steps = f.steps,
                expected_tokens = f.tokens,
                forecast_draft_ms = f.draft * 1e3,
                draft_ms = draft_timing.step_seconds * 1e3,
                forecast_catch_up_ms = f.catch_up * 1e3,
                catch_up_ms = draft_timing.catch_up_seconds * 1e3,
                catch_up_tokens = draft_timing.catch_up_tokens,
                forecast_verify_ms = f.verify * 1e3,
                verify_ms = result.seconds * 1e3,
                round_ms = round_secs * 1e3,
                "round"
            );
        }
        telemetry::record_step(
            round_secs,
            result.seconds,
            (draft_secs > 0.0).then_some(draft_secs),
        );
        if self.any_busy > 0.0 {
            telemetry::set_overlap(self.both_busy / self.any_busy);
        }
        // Decode-only forwards keep the verification costs current at today's context depths
        // and batch widths.
        if widths.iter().all(|(work, _)| *work == TargetWork::Verify) {
            let width = widths.iter().map(|(_, w)| w).sum();
            self.costs.record_verify(result.seconds, width);
        }

        let mut ended = Vec::new();
        for outcome in result.outcomes {
            let (id, o) = match outcome {
                Ok(o) => (o.seq, Ok(o)),
                Err((seq, msg)) => (seq, Err(msg)),
            };
            let Some(s) = self.active.iter_mut().find(|s| s.id == id) else {
                continue;
            };
            let o = match o {
                Ok(o) => o,
                Err(msg) => {
                    ended.push((id, Err(msg)));
                    continue;
                }
            };
            s.accept_rng = o.rng;
            let (chunk_len, drafts) = &sent[&id];
            if !s.decoding() {
                s.prefilled += chunk_len;
                if s.decoding() {
                    telemetry::record_prefill(s.admitted.elapsed().as_secs_f64());
                }
            } else {
                telemetry::record_round(drafts.len(), o.accepted);
                self.speedup.record(drafts.len(), o.accepted, &self.costs);
                if !drafts.is_empty() {
                    s.spec.rounds += 1;
                    s.spec.draft_tokens += drafts.len();
                    s.spec.accepted_tokens += o.accepted;
                }
                s.governor.record_round(drafts.len(), o.accepted);
                self.acceptance
                    .record(drafts.len(), o.accepted, POOLED_ACCEPTANCE_DECAY);
            }
            let Some(next) = o.next_token else { continue };
            let round = drafts[..o.accepted].iter().copied().chain([next]);
            match emit_round(s, round) {
                Ok(Some(finish)) => ended.push((id, Ok(finish))),
                Ok(None) => {
                    if let Some(g) = guessed.remove(&id) {
                        let used = o.accepted == drafts.len() && adopt_guess(s, g, next);
                        self.drafted_ahead += 1;
                        self.ahead_used += u64::from(used);
                        telemetry::record_draft_ahead(used);
                    }
                }
                Err(e) => ended.push((id, Err(e.to_string()))),
            }
        }
        if let Some(x) = self.speedup.get() {
            telemetry::set_speedup_estimate(x);
        }
        for (id, end) in ended {
            let Some(pos) = self.active.iter().position(|s| s.id == id) else {
                continue;
            };
            let s = self.active.swap_remove(pos);
            telemetry::record_finished(
                match &end {
                    Ok(finish) => finish.as_openai(),
                    Err(_) => "error",
                },
                s.spec.draft_tokens,
                s.spec.accepted_tokens,
                s.arrived.elapsed().as_secs_f64(),
            );
            let event = match end {
                Ok(finish) => EngineEvent::Done {
                    finish,
                    usage: Usage {
                        prompt_tokens: s.prompt_len(),
                        completion_tokens: s.emitter.generated(),
                        speculative: s.spec.clone(),
                    },
                },
                Err(msg) => EngineEvent::Failed(msg),
            };
            let _ = s.events.send(event);
            self.retire(s).await;
        }
        Ok(())
    }
}

/// Makes a draft made ahead (see `Scheduler::draft_ahead_item`) the sequence's next drafts if
/// its guess held: the round's drafts all stood (the caller checks) and its first token is the
/// one the target added, `next`. Its other tokens were drafted after exactly the context the
/// sequence now has, so they are drafts like any other, and the acceptance rule keeps the
/// output exact. Otherwise it is dropped, and the sequence's draft RNG stays where it was.
fn adopt_guess(s: &mut Sequence, guess: DraftOutcome, next: u32) -> bool {
    let Ok(mut p) = guess.proposal else {
        return false;
    };
    if p.tokens.len() < 2 || p.tokens[0] != next {
        return false;
    }
    p.drop_first();
    s.pending = Some(p);
    s.draft_rng = guess.rng;
    s.drafter_seen = s.context.len();
    true
}

/// Emits a round's tokens (the accepted drafts, then the sampled token) through the sequence's
/// emitter, stopping at the first stop condition, and sends what came out as one event.
fn emit_round(
    s: &mut Sequence,
    round: impl Iterator<Item = u32>,
) -> Result<Option<FinishReason>, EngineError> {
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut finish = None;
    for t in round {
        s.context.push(t);
        tokens.push(t);
        finish = s.emitter.push(t)?;
        text.push_str(s.emitter.delta());
        if finish.is_some() {
            break;
        }
    }
    if finish.is_none() && s.context.len() > s.max_context {
        s.emitter.end(FinishReason::ContextFull)?;
        text.push_str(s.emitter.delta());
        finish = Some(FinishReason::ContextFull);
    }
    let now = Instant::now();
    telemetry::record_tokens(
        tokens.len(),
        s.last_output.map(|t| (now - t).as_secs_f64()),
        (now - s.arrived).as_secs_f64(),
    );
    s.last_output = Some(now);
    let _ = s.events.send(EngineEvent::Output { tokens, text });
    Ok(finish)
}

impl Actor for Scheduler {
    type Args = Self;
    type Error = Infallible;

    async fn on_start(state: Self, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(state)
    }
}

impl Message<Submit> for Scheduler {
    type Reply = Result<u64, EngineError>;

    async fn handle(&mut self, msg: Submit, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        check_request(&msg.request.generation, self.cfg.context_len)?;
        if let Some(l) = msg.request.lenience {
            if !(l > 0.0 && l <= 1.0) {
                return Err(EngineError::InvalidRequest(format!(
                    "lenience must be in (0, 1], got {l}"
                )));
            }
        }
        if let GammaPolicy::Fixed(g) = msg.request.gamma {
            if g == 0 || g > self.cfg.max_gamma {
                return Err(EngineError::InvalidRequest(format!(
                    "speculative.gamma must be in 1..={}, got {g}",
                    self.cfg.max_gamma
                )));
            }
        }
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

impl Message<Step> for Scheduler {
    type Reply = ();

    async fn handle(&mut self, _: Step, ctx: &mut Context<Self, Self::Reply>) {
        self.step_scheduled = false;
        if let Err(e) = self.step().await {
            // A failure of the whole forward (not of one request's sampling): every active
            // request is told, and its resources go back.
            for s in std::mem::take(&mut self.active) {
                telemetry::record_finished(
                    "error",
                    s.spec.draft_tokens,
                    s.spec.accepted_tokens,
                    s.arrived.elapsed().as_secs_f64(),
                );
                let _ = s.events.send(EngineEvent::Failed(e.to_string()));
                self.retire(s).await;
            }
        }
        telemetry::set_queue(self.active.len(), self.queue.len());
        self.schedule_step(ctx.actor_ref());
    }
}

impl Message<GetSchedulerStats> for Scheduler {
    type Reply = SchedulerStats;

    async fn handle(
        &mut self,
        _: GetSchedulerStats,
        _: &mut Context<Self, Self::Reply>,
    ) -> SchedulerStats {
        SchedulerStats {
            active: self.active.len(),
            queued: self.queue.len(),
            rounds: self.rounds,
            overlap_ratio: if self.any_busy > 0.0 {
                self.both_busy / self.any_busy
            } else {
                0.0
            },
            drafted_ahead: self.drafted_ahead,
            ahead_used: self.ahead_used,
        }
    }
}
