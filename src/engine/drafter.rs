//! The Drafter actor: proposes drafts for a set of sequences on its own compute worker, keeping
//! each sequence's drafter state (a draft model's KV cache) between rounds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kameo::error::Infallible;
use kameo::message::{Context, Message};
use kameo::Actor;

use super::messages::{DraftBatch, DraftItem, DraftOutcome, EndSequence, GetDraftStepCost};
use super::worker::ComputeWorker;
use super::EngineError;
use crate::draft::{Drafter as Propose, ModelDrafter, PromptLookup, Proposal};
use crate::model::Llama;
use crate::sampling::{SamplingParams, SeededRng};

/// Where drafts come from.
#[derive(Clone)]
pub enum DraftSource {
    PromptLookup,
    Model { model: Arc<Llama>, name: String },
}

impl DraftSource {
    fn new_drafter(&self) -> Box<dyn Propose + Send> {
        match self {
            Self::PromptLookup => Box::new(PromptLookup::default()),
            Self::Model { model, name } => Box::new(ModelDrafter::new(Arc::clone(model), name)),
        }
    }
}

pub struct DraftState {
    source: DraftSource,
    seqs: HashMap<u64, Box<dyn Propose + Send>>,
}

pub struct Drafter {
    worker: ComputeWorker<DraftState>,
}

impl Drafter {
    pub fn new(source: DraftSource, threads: usize) -> Result<Self, EngineError> {
        let state = DraftState {
            source,
            seqs: HashMap::new(),
        };
        Ok(Self {
            worker: ComputeWorker::spawn("tandem-draft", threads, state)?,
        })
    }
}

impl Actor for Drafter {
    type Args = Self;
    type Error = Infallible;

    async fn on_start(state: Self, _: kameo::actor::ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(state)
    }
}

impl Message<DraftBatch> for Drafter {
    type Reply = Result<Vec<DraftOutcome>, EngineError>;

    async fn handle(&mut self, msg: DraftBatch, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| msg.items.into_iter().map(|it| draft_one(s, it)).collect())
            .await
    }
}

fn draft_one(s: &mut DraftState, it: DraftItem) -> DraftOutcome {
    let start = Instant::now();
    let mut rng = it.rng;
    let source = &s.source;
    let drafter = s.seqs.entry(it.seq).or_insert_with(|| source.new_drafter());
    let mut proposal = Proposal::default();
    // Everything but the last (unverified) token of the context stands.
    let result = drafter
        .rollback(it.context.len().saturating_sub(1))
        .and_then(|()| {
            drafter.propose(
                &it.context,
                it.prompt_len,
                it.gamma,
                &it.params,
                &mut rng,
                &mut proposal,
            )
        })
        .map(|()| {
            proposal.tokens.truncate(it.gamma);
            proposal.dists.truncate(it.gamma * proposal.vocab);
            proposal
        })
        .map_err(|e| e.to_string());
    DraftOutcome {
        seq: it.seq,
        proposal: result,
        rng,
        seconds: start.elapsed().as_secs_f64(),
    }
}

impl Message<EndSequence> for Drafter {
    type Reply = Result<(), EngineError>;

    async fn handle(
        &mut self,
        msg: EndSequence,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(move |s| {
                s.seqs.remove(&msg.seq);
            })
            .await
    }
}

impl Message<GetDraftStepCost> for Drafter {
    type Reply = Result<f64, EngineError>;

    /// Drafts 4 tokens after a 32-token context twice with a throwaway drafter and times the
    /// second (cache already filled): one draft step is a quarter of it.
    async fn handle(
        &mut self,
        _: GetDraftStepCost,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(|s| {
                let mut d = s.source.new_drafter();
                let context: Vec<u32> = (0..32u32).map(|i| (i * 7919 + 13) % 256).collect();
                let mut p = Proposal::default();
                let mut rng = SeededRng::new(0);
                let params = SamplingParams::greedy();
                let mut best = f64::INFINITY;
                for _ in 0..3 {
                    d.rollback(context.len() - 1).map_err(|e| e.to_string())?;
                    let t = Instant::now();
                    d.propose(&context, context.len(), 4, &params, &mut rng, &mut p)
                        .map_err(|e| e.to_string())?;
                    best = best.min(t.elapsed().as_secs_f64());
                }
                Ok::<f64, String>(best / 4.0)
            })
            .await?
            .map_err(EngineError::Draft)
    }
}
