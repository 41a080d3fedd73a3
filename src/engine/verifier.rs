//! The Verifier actor: batched target forwards (prompt chunks, plain steps and verification of
//! drafts) on its compute worker, whose round is `target_round.rs`; slot upkeep between rounds
//! (a prompt started from the prefix cache or a running sequence, a finished sequence stored
//! in the prefix cache, a slot freed); timing forwards for the governor at start-up.

use std::sync::Arc;

use kameo::message::{Context, Message};
use kameo::Actor;

use super::acceptance::Scratch;
use super::error::EngineError;
use super::messages::{
    ClearPrefixCache, CopyPrefix, FreeSlot, PrefixStart, StartFromPrefix, StorePrefix, TargetBatch,
    TargetBatchResult,
};
use super::plain_run::run_round;
pub use super::target_round::TargetState;
use super::worker::ComputeWorker;
use crate::model::cache::prefix_store::{PrefixStore, PrefixStoreStats};
use crate::model::{Decoder, FeatureTaps};
use crate::sampling::Sampler;
use crate::telemetry;
pub use timing::{DepthRound, TimedForward};

mod timing;

#[derive(Actor)]
pub struct Verifier {
    worker: ComputeWorker<TargetState>,
}

impl Verifier {
    /// `features`: outcomes carry these hidden states of the positions that stand.
    /// `prefix_budget`: bytes the target's prefix cache may hold.
    pub fn new(
        model: Arc<Decoder>,
        slots: usize,
        threads: usize,
        features: Option<FeatureTaps>,
        prefix_budget: usize,
    ) -> Result<Self, EngineError> {
        let cache = model.new_cache(slots);
        let prefix = PrefixStore::new(prefix_budget, cache.bytes_per_token());
        let state = TargetState {
            model,
            cache,
            scratch: Scratch::default(),
            sampler: Sampler::default(),
            features,
            prefix,
        };
        Ok(Self {
            worker: ComputeWorker::spawn("tandem-target", threads, state)?,
        })
    }

    /// Times target forwards of each of `widths` new tokens `depth` context tokens deep (less
    /// where the cache is shorter) on `slot` (free at start-up), best of `repeats`, for the
    /// governor's cost model. `alike`: every token the
    /// same, so a mixture's rows all choose the same experts (made-up varied text otherwise,
    /// whose rows choose nearly as uniform routing would).
    pub async fn calibrate(
        &self,
        slot: usize,
        widths: Vec<usize>,
        (depth, repeats): (usize, usize),
        alike: bool,
    ) -> Result<Vec<TimedForward>, EngineError> {
        self.worker
            .run(move |s| timing::calibrate(s, slot, &widths, (depth, repeats), alike))
            .await?
    }

    /// Times `widths` on `slot` in `rounds` rounds, each timing every width once `shallow`
    /// and then `deep` context tokens deep (less where the cache is shorter): how forwards'
    /// prices grow with depth, each round's two depths timed at the machine's speed of the
    /// moment.
    pub async fn time_depths(
        &self,
        slot: usize,
        widths: Vec<usize>,
        depths: (usize, usize),
        rounds: usize,
    ) -> Result<Vec<DepthRound>, EngineError> {
        self.worker
            .run(move |s| timing::time_depths(s, slot, &widths, depths, rounds))
            .await?
    }
}

impl Message<TargetBatch> for Verifier {
    type Reply = Result<TargetBatchResult, EngineError>;

    async fn handle(
        &mut self,
        msg: TargetBatch,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker.run(move |s| run_round(s, msg.items)).await?
    }
}

impl Message<CopyPrefix> for Verifier {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, msg: CopyPrefix, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| Ok(s.cache.copy_prefix(msg.from, msg.to, msg.len)?))
            .await?
    }
}

impl Message<StartFromPrefix> for Verifier {
    type Reply = Result<PrefixStart, EngineError>;

    async fn handle(
        &mut self,
        msg: StartFromPrefix,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker.run(move |s| start_from_prefix(s, &msg)).await?
    }
}

/// The new slot starts empty, then from the store or the running sequence, whichever holds
/// more of the prompt.
fn start_from_prefix(
    s: &mut TargetState,
    msg: &StartFromPrefix,
) -> Result<PrefixStart, EngineError> {
    if s.cache.is_allocated(msg.slot) {
        s.cache.free(msg.slot)?;
    }
    let len = s.prefix.start(
        &mut s.cache,
        msg.slot,
        msg.scope,
        (&msg.prompt, msg.limit),
        msg.running,
    )?;
    Ok(PrefixStart {
        len,
        store: report_store(&mut s.prefix),
    })
}

/// Exports what the target's store holds (and its evictions) as metrics; returns it.
fn report_store(store: &mut PrefixStore) -> PrefixStoreStats {
    let stats = store.stats();
    telemetry::set_prefix_cache(
        "target",
        stats.runs,
        stats.tokens,
        stats.bytes,
        stats.budget_bytes,
    );
    telemetry::record_prefix_evictions("target", store.take_evictions());
    stats
}

impl Message<StorePrefix> for Verifier {
    type Reply = Result<PrefixStoreStats, EngineError>;

    async fn handle(
        &mut self,
        msg: StorePrefix,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(move |s| {
                let stored = s.prefix.insert(&s.cache, msg.slot, msg.scope, &msg.tokens);
                if s.cache.is_allocated(msg.slot) {
                    s.cache.free(msg.slot)?;
                }
                stored?;
                Ok(report_store(&mut s.prefix))
            })
            .await?
    }
}

impl Message<ClearPrefixCache> for Verifier {
    type Reply = Result<PrefixStoreStats, EngineError>;

    async fn handle(
        &mut self,
        _: ClearPrefixCache,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(|s| {
                s.prefix.clear();
                Ok(report_store(&mut s.prefix))
            })
            .await?
    }
}

impl Message<FreeSlot> for Verifier {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, msg: FreeSlot, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| {
                if s.cache.is_allocated(msg.slot) {
                    s.cache.free(msg.slot)?;
                }
                Ok(())
            })
            .await?
    }
}
