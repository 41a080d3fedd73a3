//! A draft model: any model the model layer loads, with the target's vocabulary. It keeps its
//! own KV cache, filled lazily from the context on the first round and rolled back after each.

use std::ops::Deref;

use super::{DraftError, Drafter, Proposal};
use crate::model::{KvCache, Llama, LogitsRows, SeqInput, TextTokenizer};
use crate::sampling::{
    apply_penalties, argmax, probabilities, sample_from, SamplingParams, SeededRng,
};

/// `M` is how the model is held: `&Llama` for one generation, `Arc<Llama>` in the engine.
pub struct ModelDrafter<M: Deref<Target = Llama>> {
    model: M,
    name: String,
    cache: KvCache,
    slot: usize,
    logits: Vec<f32>,
    probs: Vec<f32>,
    feed: Vec<u32>,
    history: Vec<u32>,
}

/// Refuses a drafter whose tokens mean something else than the target's: same vocabulary size
/// and the same string for every token id.
pub fn check_same_vocabulary(
    draft: &TextTokenizer,
    draft_name: &str,
    target: &TextTokenizer,
    target_name: &str,
) -> Result<(), DraftError> {
    let mismatch = |reason: String| DraftError::VocabMismatch {
        draft: draft_name.to_owned(),
        target: target_name.to_owned(),
        reason,
    };
    if draft.vocab_size() != target.vocab_size() {
        return Err(mismatch(format!(
            "{} vs {} tokens",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    for id in 0..target.vocab_size() as u32 {
        if draft.id_to_token(id) != target.id_to_token(id) {
            return Err(mismatch(format!(
                "token {id} is {:?} in the draft and {:?} in the target",
                draft.id_to_token(id),
                target.id_to_token(id)
            )));
        }
    }
    Ok(())
}

impl<M: Deref<Target = Llama>> ModelDrafter<M> {
    pub fn new(model: M, name: impl Into<String>) -> Self {
        let mut cache = model.new_cache(1);
        let slot = cache
            .allocate()
            .expect("a fresh one-slot cache has a free slot");
        Self {
            model,
            name: name.into(),
            cache,
            slot,
            logits: Vec::new(),
            probs: Vec::new(),
            feed: Vec::new(),
            history: Vec::new(),
        }
    }

    fn cached(&self) -> usize {
        self.cache.len(self.slot).unwrap_or(0)
    }
}

impl<M: Deref<Target = Llama>> Drafter for ModelDrafter<M> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn propose(
        &mut self,
        context: &[u32],
        generated_from: usize,
        gamma: usize,
        params: &SamplingParams,
        rng: &mut SeededRng,
        out: &mut Proposal,
    ) -> Result<(), DraftError> {
        out.clear();
        out.vocab = self.model.hparams().vocab_size;
        let cached = self.cached();
        if cached >= context.len() {
            // Out of step with the caller (it should have rolled us back): start over.
            self.cache.truncate_to(self.slot, 0)?;
        }
        // Room for the context and γ-1 fed drafts.
        let gamma = gamma.min((self.cache.max_len() + 1).saturating_sub(context.len()));
        self.feed.clear();
        self.feed.extend_from_slice(&context[self.cached()..]);
        self.history.clear();
        self.history.extend_from_slice(context);
        for j in 0..gamma {
            let start_pos = self.cached();
            let logits = self.model.forward(
                &mut self.cache,
                &[SeqInput {
                    slot: self.slot,
                    start_pos,
                    tokens: &self.feed,
                    logits: LogitsRows::Last,
                }],
            )?;
            let row = logits.seq_rows(0)?.pop().expect("asked for the last row");
            self.logits.clear();
            self.logits.extend_from_slice(&row);
            apply_penalties(
                &mut self.logits,
                params,
                &self.history,
                &self.history[generated_from..],
            );
            let t = if params.is_greedy() {
                argmax(&self.logits)?
            } else {
                probabilities(&self.logits, params, &mut self.probs)?;
                let t = sample_from(&self.probs, rng.next_f64());
                out.dists.extend_from_slice(&self.probs);
                t
            };
            out.tokens.push(t);
            self.history.push(t);
            if j + 1 < gamma {
                self.feed.clear();
                self.feed.push(t);
            }
        }
        Ok(())
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<(), DraftError> {
        self.cache.truncate_to(self.slot, 0)?;
        let tokens = &prompt[..prompt.len().min(self.cache.max_len())];
        if !tokens.is_empty() {
            self.model.forward(
                &mut self.cache,
                &[SeqInput {
                    slot: self.slot,
                    start_pos: 0,
                    tokens,
                    logits: LogitsRows::None,
                }],
            )?;
        }
        Ok(())
    }

    fn rollback(&mut self, keep: usize) -> Result<(), DraftError> {
        if self.cached() > keep {
            self.cache.truncate_to(self.slot, keep)?;
        }
        Ok(())
    }
}
