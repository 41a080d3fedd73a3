//! The engine's public face: start the actors, submit requests, read their event streams.
//! Used by the server, `tandem generate` and `tandem bench`.

use std::sync::Arc;

use kameo::actor::{ActorRef, Spawn};
use kameo::mailbox;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::cache_manager::CacheManager;
use super::calibration::{start_governor, StartUpPrices, Timing};
use super::drafter::Drafter;
use super::error::EngineError;
use super::event_stream::EventStream;
use super::gamma::{Gamma, GammaPolicy};
use super::governor::{CostModel, ExpertPrices, GovernorConfig};
use super::kv_room;
use super::liveness::{EngineHealth, Liveness};
use super::messages::*;
use super::prefill_timing::prefill_price_off_runtime;
use super::prefix_budget::{prefix_budgets, register_prefix_caches};
use super::price_memory::{MemoryFile, PriceMemory};
use super::request::{check_request, EngineRequest};
use super::scheduler::{DraftCoverage, DraftForesight, Scheduler, SchedulerConfig};
use super::speculation_settings::{LiveSpeculation, SpeculationSettings};
use super::verifier::Verifier;
use crate::draft::{DraftOrigins, LoadedDrafter, RequestHistory, SharedHistory};
use crate::model::Decoder;

/// Engine settings. The config file's `[engine]` table is read straight into this type (the
/// fields it does not hold are skipped and filled in by `setup`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Sequences decoded together.
    pub max_seqs: usize,
    /// Sequences that may wait for admission beyond the `max_seqs` running (a request counts
    /// its prompts times its choices); beyond this, submissions fail as overloaded.
    pub max_queue: usize,
    /// Prompt tokens prefilled per round (all sequences together).
    pub prefill_chunk: usize,
    /// Draft one group of sequences while verifying the other; with one group, draft each
    /// request's next round while verifying its current one.
    pub pipeline: bool,
    /// Compute threads of the target's and the drafter's workers (in the config file, 0 means
    /// `runtime.threads`, which `setup` fills in).
    pub target_threads: usize,
    pub draft_threads: usize,
    /// KV capacity in tokens over all sequences (default: every slot full, as far as memory
    /// holds them: `kv_room`).
    #[serde(skip)]
    pub kv_capacity_tokens: Option<usize>,
    /// The target's context is the model's own maximum (`model.context_length = 0`), which
    /// start-up may lower to what memory holds; a configured one it refuses instead.
    #[serde(skip)]
    pub context_from_model: bool,
    /// The largest γ any round may draft (`engine.max_gamma` in the config file): verification
    /// costs are measured up to it at start and KV headroom is reserved for it. The live
    /// settings' range (`gamma_min..=gamma_max`) stays within it.
    #[serde(rename = "max_gamma")]
    pub gamma_limit: usize,
    /// Store finished sequences' keys and values and start new prompts from the longest cached
    /// prefix (target and draft model).
    pub prefix_cache: bool,
    /// MiB the prefix cache may hold, both models together (absent: the default for the
    /// machine, [`prefix_budget_bytes`]).
    #[serde(default)]
    pub prefix_cache_mib: Option<usize>,
    /// The initial live speculation settings (the admin API changes them later).
    #[serde(skip)]
    pub speculation: SpeculationSettings,
    #[serde(skip)]
    pub governor: GovernorConfig,
    /// Seconds work may wait with no engine round before the engine counts as stalled: the
    /// watchdog logs it, counts it and `/health` answers 503 (0: never).
    pub stall_timeout_seconds: u64,
    /// Fault injection for tests: the scheduler stops waking itself after this many rounds,
    /// as a lost wake-up would (`TANDEM_TEST_STALL_AFTER_ROUNDS`). Never set in production.
    #[serde(skip)]
    pub stall_after_rounds: Option<u64>,
    /// Prices the governor plans with instead of measured ones: with a table here, start-up
    /// calibration is skipped and live rounds leave the prices as they are (a frozen
    /// [`CostModel`]), so which γ each round drafts depends on acceptance alone. For tests and
    /// simulations; a server measures its machine.
    #[serde(skip)]
    pub costs: Option<CostModel>,
    /// Keep what the governor learns (prices, acceptance by kind of draft) in the cache
    /// directory and start from it next time, checked first against two timed forwards
    /// (`engine.remember_prices`; `setup` fills in [`EngineConfig::price_memory`] from it).
    pub remember_prices: bool,
    /// Where the governor's learning is kept, and for what (none: every start measures anew
    /// and starts from a pooled guess of acceptance).
    #[serde(skip)]
    pub price_memory: Option<PriceMemory>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_seqs: 8,
            max_queue: 64,
            prefill_chunk: 256,
            pipeline: false,
            target_threads: 2,
            draft_threads: 2,
            kv_capacity_tokens: None,
            context_from_model: false,
            gamma_limit: 8,
            prefix_cache: true,
            prefix_cache_mib: None,
            stall_timeout_seconds: 60,
            stall_after_rounds: None,
            speculation: SpeculationSettings::default(),
            governor: GovernorConfig::default(),
            costs: None,
            remember_prices: true,
            price_memory: None,
        }
    }
}

pub struct Engine {
    scheduler: ActorRef<Scheduler>,
    /// One permit per sequence queued or running (`max_seqs + max_queue` in all): taken
    /// before a request reaches the scheduler's mailbox, so a burst is refused here with
    /// `Overloaded` and never piles up in a queue; each sequence gives its permit back when
    /// the scheduler drops it.
    capacity: Arc<Semaphore>,
    capacity_total: usize,
    liveness: Arc<Liveness>,
    cache: ActorRef<CacheManager>,
    settings: LiveSpeculation,
    context_len: usize,
    has_drafter: bool,
    max_seqs: usize,
    start_up: StartUpPrices,
}

impl Engine {
    /// Starts the actors and their compute workers, and measures the costs the governor needs
    /// (target forwards of 1..=γmax+1 tokens, one draft step).
    pub async fn start(
        target: Arc<Decoder>,
        draft: Option<LoadedDrafter>,
        mut cfg: EngineConfig,
    ) -> Result<Self, EngineError> {
        let settings = live_settings(&cfg)?;
        let slots = cfg.max_seqs;
        let (target_budget, draft_budget) = prefix_budgets(
            (cfg.prefix_cache, cfg.prefix_cache_mib),
            &target,
            draft.as_ref(),
        );
        let room = kv_room::room_for(
            (&target, draft.as_ref()),
            (cfg.max_seqs, cfg.context_from_model),
            target_budget + draft_budget,
        )?;
        let context_len = room.context_len;
        // A head drafts from the target's features of each round: it drafts after the
        // verification, never beside it.
        let features = draft.as_ref().and_then(LoadedDrafter::feature_taps);
        let head = features.is_some();
        let history = shared_history(draft.as_ref());
        let (foresight, coverage, origins) = drafter_views(draft.as_ref(), history.clone());
        let verifier = Verifier::new(
            Arc::clone(&target),
            slots,
            cfg.target_threads,
            features,
            target_budget,
        )?;
        let has_drafter = draft.is_some();
        let draft_name = draft.as_ref().map(LoadedDrafter::name);
        let draft_cache = draft.as_ref().is_some_and(LoadedDrafter::keeps_a_cache);
        register_prefix_caches(cfg.prefix_cache, draft_cache, (target_budget, draft_budget));
        let drafter = spawn_drafter(draft, &target, &cfg, (draft_budget, history))?;
        let timing = Timing {
            verifier: &verifier,
            drafter: drafter.as_ref(),
            max_seqs: cfg.max_seqs,
            gamma_limit: cfg.gamma_limit,
            context_len,
            experts: expert_prices(&target),
        };
        let memory = memory_file(&cfg, draft_name.as_deref());
        let (learned, memory, start_up) = start_governor(cfg.costs.take(), timing, memory).await?;
        let cache = CacheManager::spawn(CacheManager::new(
            slots,
            cfg.kv_capacity_tokens.unwrap_or(room.capacity_tokens),
            draft_cache,
        ));
        let liveness = Liveness::new(
            (cfg.stall_timeout_seconds > 0)
                .then(|| std::time::Duration::from_secs(cfg.stall_timeout_seconds)),
        );
        let prefill_price = prefill_price_off_runtime(&target).await;
        let scheduler_cfg = SchedulerConfig {
            max_seqs: cfg.max_seqs,
            prefill_chunk: cfg.prefill_chunk,
            prefill_price,
            pipeline: cfg.pipeline && !head,
            context_len,
            gamma_limit: cfg.gamma_limit,
            prefix_cache: cfg.prefix_cache,
            governor: cfg.governor,
            foresight,
            coverage,
            origins,
            stall_after_rounds: cfg.stall_after_rounds,
        };
        // Unbounded: the scheduler's own wake-up (`Step`) must never be refused for room.
        // What clients can put in it is bounded by `capacity` below.
        let scheduler = Scheduler::spawn_with_mailbox(
            Scheduler::new(
                scheduler_cfg,
                Verifier::spawn(verifier),
                drafter,
                cache.clone(),
                settings.clone(),
                (learned, memory),
                Arc::clone(&liveness),
            ),
            mailbox::unbounded(),
        );
        super::watchdog::spawn(&liveness, scheduler.downgrade());
        let capacity_total = cfg.max_seqs + cfg.max_queue;
        Ok(Self {
            scheduler,
            capacity: Arc::new(Semaphore::new(capacity_total)),
            capacity_total,
            liveness,
            cache,
            settings,
            context_len,
            has_drafter,
            max_seqs: cfg.max_seqs,
            start_up,
        })
    }

    /// The live speculation settings (read and changed by the admin API).
    pub fn settings(&self) -> &LiveSpeculation {
        &self.settings
    }

    /// Most tokens (prompt + output) one sequence may hold.
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    pub fn has_drafter(&self) -> bool {
        self.has_drafter
    }

    /// Where the governor's first prices came from (timed, remembered, a table) and the
    /// seconds start-up spent on them.
    pub fn start_up_prices(&self) -> StartUpPrices {
        self.start_up
    }

    /// Sequences decoded together (also the most choices one request may ask for).
    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    /// Queues a request. Errors (invalid, too long, overloaded) come back before any work: the
    /// request is checked here, so a bad one never waits behind a running round. Dropping the
    /// returned stream cancels the request within a round.
    pub async fn submit(&self, request: EngineRequest) -> Result<EventStream, EngineError> {
        let mut streams = self.submit_choices(request, 1).await?;
        Ok(streams.pop().expect("one choice"))
    }

    /// Queues `n` choices of one request (at most `engine.max_seqs`), admitted together: the
    /// first prefills the prompt and the others start from a copy of its cache. Choice `i` of
    /// a request seeded `s` samples with seed `s + i`, exactly as a lone request with that seed
    /// would; unseeded, each choice draws its own.
    pub async fn submit_choices(
        &self,
        request: EngineRequest,
        n: usize,
    ) -> Result<Vec<EventStream>, EngineError> {
        self.submit_batch(vec![request], n).await
    }

    /// Queues several prompts' requests, `n` choices each, all or none: room for every
    /// sequence is taken at once (a batch counts against `max_queue` as its prompts times
    /// its choices), so a batch is never queued part-way.
    pub async fn submit_batch(
        &self,
        requests: Vec<EngineRequest>,
        n: usize,
    ) -> Result<Vec<EventStream>, EngineError> {
        let sequences = requests.len() * n;
        if n == 0 || sequences == 0 || n > self.max_seqs || sequences > self.capacity_total {
            return Err(EngineError::InvalidRequest(format!(
                "a request may hold 1 to {} sequences (prompts times choices: engine.max_seqs + \
                 engine.max_queue), with at most {} choices each; this one holds {} prompts of \
                 {n} choices",
                self.capacity_total,
                self.max_seqs,
                requests.len()
            )));
        }
        for r in &requests {
            self.check(r)?;
        }
        let mut permits = Arc::clone(&self.capacity)
            .try_acquire_many_owned(sequences as u32)
            .map_err(|_| EngineError::Overloaded {
                capacity: self.capacity_total,
            })?;
        let mut streams = Vec::with_capacity(sequences);
        for request in requests {
            let mine = permits.split(n).expect("one permit per sequence was taken");
            streams.extend(self.submit_with(request, n, mine).await?);
        }
        Ok(streams)
    }

    async fn submit_with(
        &self,
        request: EngineRequest,
        n: usize,
        permits: OwnedSemaphorePermit,
    ) -> Result<Vec<EventStream>, EngineError> {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..n).map(|_| mpsc::unbounded_channel()).unzip();
        let first = self
            .scheduler
            .ask(Submit {
                request,
                events: senders,
                permits,
            })
            .await
            .map_err(|e| match e {
                kameo::error::SendError::HandlerError(e) => e,
                other => EngineError::Worker(format!("scheduler: {other}")),
            })?;
        Ok(receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| EventStream {
                id: first + i as u64,
                rx,
            })
            .collect())
    }

    /// What a request must pass before it is queued (lenience and γ's own range are checked
    /// when their values are made).
    pub fn check(&self, request: &EngineRequest) -> Result<(), EngineError> {
        check_request(&request.generation, self.context_len)?;
        if let GammaPolicy::Fixed(g) = request.speculative.gamma {
            Gamma::within(g.get(), self.settings.gamma_limit())
                .map_err(|e| EngineError::InvalidRequest(format!("speculative.gamma {e}")))?;
        }
        Ok(())
    }

    /// Whether the engine is making progress (read without asking it: a stalled scheduler
    /// answers no message).
    pub fn health(&self) -> EngineHealth {
        self.liveness.health()
    }

    /// Whether the model's last forward gave NaN or infinite logits (until one is sound).
    pub fn logits_broken(&self) -> bool {
        self.liveness.logits_broken()
    }

    /// Sequences the engine may hold at once, running and queued (`max_seqs + max_queue`).
    pub fn capacity(&self) -> usize {
        self.capacity_total
    }

    pub async fn cache_stats(&self) -> Result<CacheStats, EngineError> {
        self.cache
            .ask(GetCacheStats)
            .await
            .map_err(|e| EngineError::Worker(format!("cache manager: {e}")))
    }

    /// Forgets everything the prefix cache holds (the target's and a draft model's), so what
    /// comes next starts from a cold cache. Sequences running keep theirs.
    pub async fn clear_prefix_cache(&self) -> Result<(), EngineError> {
        self.scheduler
            .ask(ClearPrefixCache)
            .await
            .map_err(|e| EngineError::Worker(format!("scheduler: {e}")))
    }

    pub async fn stats(&self) -> Result<SchedulerStats, EngineError> {
        self.scheduler
            .ask(GetSchedulerStats)
            .await
            .map_err(|e| EngineError::Worker(format!("scheduler: {e}")))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.liveness.mark_shut_down();
    }
}

/// The store of earlier requests that prompt lookup across requests (`suffix`, alone) drafts
/// from and the scheduler foresees its rounds from; `None` for any other drafter.
fn shared_history(draft: Option<&LoadedDrafter>) -> Option<SharedHistory> {
    match draft? {
        LoadedDrafter::PromptLookup(l) => RequestHistory::shared_for(*l),
        _ => None,
    }
}

/// What the scheduler knows of the drafter: each round's kind of draft foreseen where it
/// drafts prompt lookup's match first (alone, or before a head; across requests, from the
/// store `history` it shares with the drafter); a prompt's coverage where it is a model of
/// another vocabulary; what its drafts are called.
fn drafter_views(
    draft: Option<&LoadedDrafter>,
    history: Option<SharedHistory>,
) -> (Option<DraftForesight>, Option<DraftCoverage>, DraftOrigins) {
    let Some(d) = draft else {
        return (None, None, DraftOrigins::default());
    };
    let alone = matches!(d, LoadedDrafter::PromptLookup(_));
    (
        d.lookup()
            .and_then(|l| DraftForesight::new(l, !alone, history)),
        d.translation().map(|t| DraftCoverage::new(Arc::clone(t))),
        d.origins(),
    )
}

/// The file the governor's learning is kept in, when prices are remembered.
fn memory_file(cfg: &EngineConfig, drafter: Option<&str>) -> Option<MemoryFile> {
    cfg.price_memory
        .as_ref()
        .filter(|_| cfg.remember_prices)
        .map(|m| MemoryFile::new(m, &engine_identity(cfg, drafter)))
}

/// A mixture of experts' target: its forwards priced by the experts they read, every layer
/// routed.
fn expert_prices(target: &Decoder) -> Option<ExpertPrices> {
    let h = target.hparams();
    h.experts
        .map(|e| ExpertPrices::new(e.count, e.used, h.num_layers))
}

/// The live speculation settings an engine of `cfg` starts with, once its sizes are checked.
fn live_settings(cfg: &EngineConfig) -> Result<LiveSpeculation, EngineError> {
    if cfg.max_seqs == 0 || cfg.gamma_limit == 0 {
        return Err(EngineError::InvalidRequest(
            "engine.max_seqs and engine.max_gamma must be at least 1".into(),
        ));
    }
    LiveSpeculation::new(cfg.speculation, cfg.gamma_limit)
        .map_err(|e| EngineError::InvalidRequest(format!("speculation.{e}")))
}

/// The engine's own settings a remembered price table and acceptance depend on, as text
/// (the model files, machine and build are the caller's part of the identity).
fn engine_identity(cfg: &EngineConfig, drafter: Option<&str>) -> String {
    format!(
        "engine max_seqs={} gamma_limit={} prefill_chunk={} pipeline={} threads={}/{} \
         prefix_cache={}\nspeculation {:?}\ndrafter {}",
        cfg.max_seqs,
        cfg.gamma_limit,
        cfg.prefill_chunk,
        cfg.pipeline,
        cfg.target_threads,
        cfg.draft_threads,
        cfg.prefix_cache,
        cfg.speculation,
        drafter.unwrap_or("none"),
    )
}

/// The Drafter actor for `draft` (none without a drafter), with its share of the prefix cache.
fn spawn_drafter(
    draft: Option<LoadedDrafter>,
    target: &Arc<Decoder>,
    cfg: &EngineConfig,
    (draft_budget, history): (usize, Option<SharedHistory>),
) -> Result<Option<ActorRef<Drafter>>, EngineError> {
    let Some(source) = draft else {
        return Ok(None);
    };
    Ok(Some(Drafter::spawn(Drafter::new(
        source,
        Arc::clone(target),
        cfg.draft_threads,
        cfg.max_seqs,
        (cfg.prefix_cache.then_some(draft_budget), history),
    )?)))
}
