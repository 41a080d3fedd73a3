//! The Verifier actor: batched target forwards (prompt chunks, plain steps and verification of
//! drafts) on its compute worker, whose round is `target_round.rs`; slot upkeep between rounds
//! (a prompt started from the prefix cache or a running sequence, a finished sequence stored
//! in the prefix cache, a slot freed); timing forwards for the governor at start-up.

use std::sync::Arc;
use std::time::Instant;

use kameo::message::{Context, Message};
use kameo::Actor;

use super::acceptance::Scratch;
use super::error::EngineError;
use super::messages::{
    ClearPrefixCache, CopyPrefix, FreeSlot, PrefixStart, StartFromPrefix, StorePrefix, TargetBatch,
    TargetBatchResult,
};
use super::target_round::run_batch;
pub use super::target_round::TargetState;
use super::worker::ComputeWorker;
use crate::model::cache::prefix_store::{PrefixStore, PrefixStoreStats};
use crate::model::decoder::expert_trace;
use crate::model::{Decoder, FeatureTaps, Kept, LogitsRows, SeqInput};
use crate::sampling::Sampler;
use crate::telemetry;

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
            .run(move |s| calibrate(s, slot, &widths, (depth, repeats), alike))
            .await?
    }
}

/// A start-up forward: its width, the context tokens before it, its best time, and the distinct
/// experts each routed layer of a mixture read in it.
#[derive(Clone, Debug)]
pub struct TimedForward {
    pub width: usize,
    pub depth: usize,
    pub seconds: f64,
    pub reads: Vec<u16>,
}

/// The most context tokens a calibration runs through the model (see `calibrate`).
const PREFILLED: usize = 32;

fn calibrate(
    s: &mut TargetState,
    slot: usize,
    widths: &[usize],
    (depth, repeats): (usize, usize),
    alike: bool,
) -> Result<Vec<TimedForward>, EngineError> {
    let vocab = s.model.hparams().vocab_size as u32;
    let max_len = s.cache.max_len();
    let widths: Vec<usize> = widths
        .iter()
        .copied()
        .filter(|&w| w > 0 && w < max_len)
        .collect();
    let max_width = widths.iter().copied().max().unwrap_or(0);
    let depth = depth.min(s.cache.max_len().saturating_sub(max_width + 1));
    s.cache.allocate_slot(slot)?;
    let ids: Vec<u32> = (0..depth.max(1) + max_width)
        .map(|i| {
            if alike {
                13 % vocab
            } else {
                (i as u32 * 7919 + 13) % vocab
            }
        })
        .collect();
    let run = |s: &mut TargetState| -> Result<Vec<TimedForward>, EngineError> {
        // The first tokens run through the model; a deeper context is filled with copies of
        // their keys and values: attention costs the same whatever the keys hold, and a
        // 512-token prefill would add most of a second to start-up.
        let computed = depth.clamp(1, PREFILLED);
        s.model.forward(
            &mut s.cache,
            &[SeqInput {
                slot,
                start_pos: 0,
                tokens: &ids[..computed],
                logits: LogitsRows::None,
                parents: &[],
            }],
        )?;
        let copies = s.cache.read_run(slot, 0, computed)?;
        while s.cache.len(slot)? < depth {
            let more = (depth - s.cache.len(slot)?).min(computed);
            s.cache.append_run(slot, &copies, more)?;
        }
        let base = s.cache.len(slot)?;
        let mut best: Vec<TimedForward> = widths
            .iter()
            .map(|&width| TimedForward {
                width,
                depth: base,
                seconds: f64::INFINITY,
                reads: Vec::new(),
            })
            .collect();
        for _ in 0..repeats.max(1) {
            for b in best.iter_mut() {
                expert_trace::count_reads();
                let t = Instant::now();
                s.model.forward(
                    &mut s.cache,
                    &[SeqInput {
                        slot,
                        start_pos: base,
                        tokens: &ids[base..base + b.width],
                        logits: LogitsRows::All,
                        parents: &[],
                    }],
                )?;
                b.seconds = b.seconds.min(t.elapsed().as_secs_f64());
                expert_trace::take_reads(&mut b.reads);
                s.cache.keep(slot, Kept::First(base))?;
            }
        }
        Ok(best)
    };
    let result = run(s);
    s.cache.free(slot)?;
    result
}

impl Message<TargetBatch> for Verifier {
    type Reply = Result<TargetBatchResult, EngineError>;

    async fn handle(
        &mut self,
        msg: TargetBatch,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker.run(move |s| run_batch(s, msg.items)).await?
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
