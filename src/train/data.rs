//! The training data: the target's own answers to chat prompts (greedy, and sampled), the
//! frequency ranking of the tokens it wrote (the draft vocabulary), and the target's features
//! along each answer.

use serde::{Deserialize, Serialize};

use super::TrainError;
use std::sync::Arc;

use crate::engine::{Engine, EngineConfig, EngineRequest, GenerationRequest, RequestSpeculation};
use crate::model::cache::prefix_store::common_prefix;
use crate::model::{Decoder, FeatureTaps, Kept, KvCache, LogitsRows, SeqInput};
use crate::sampling::SamplingParams;

/// One prompt and the target's answer to it, as one token sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub tokens: Vec<u32>,
    /// Where the answer starts.
    pub answer_from: usize,
    /// Sampled (at the temperature asked for) rather than greedy.
    pub sampled: bool,
}

/// One answer to ask the target for: a rendered prompt, greedy (`seed: None`) or sampled with
/// this seed.
#[derive(Clone, Debug, PartialEq)]
pub struct AnswerJob {
    pub prompt: Vec<u32>,
    pub seed: Option<u64>,
}

/// One greedy and `sampled` sampled answers to each prompt, the sampled ones seeded by `seed`
/// and their place.
pub fn answer_jobs(prompts: &[Vec<u32>], sampled: usize, seed: u64) -> Vec<AnswerJob> {
    let mut jobs = Vec::with_capacity(prompts.len() * (1 + sampled));
    for (i, prompt) in prompts.iter().enumerate() {
        for j in 0..=sampled {
            jobs.push(AnswerJob {
                prompt: prompt.clone(),
                seed: (j > 0).then(|| seed.wrapping_add((i * 1000 + j) as u64)),
            });
        }
    }
    jobs
}

/// The target's answers to `jobs`, in their order, each up to `max_tokens`, sampled ones at
/// `temperature`. They are decoded by the engine, `concurrency` at a time (a sequence's
/// tokens do not depend on its batch); `progress(done, total)` as they finish, in order.
pub async fn answer_prompts(
    target: Arc<Decoder>,
    jobs: &[AnswerJob],
    (max_tokens, eos_ids): (usize, &[u32]),
    temperature: f32,
    (concurrency, threads): (usize, usize),
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Answer>, TrainError> {
    let total = jobs.len();
    let cfg = EngineConfig {
        max_seqs: concurrency.max(1),
        max_queue: total.max(1),
        target_threads: threads.max(1),
        draft_threads: 1,
        ..EngineConfig::default()
    };
    let engine = Engine::start(target, None, cfg).await?;
    let mut pending = Vec::with_capacity(total);
    for job in jobs {
        let sampling = match job.seed {
            None => SamplingParams::greedy(),
            Some(seed) => SamplingParams {
                temperature,
                seed: Some(seed),
                ..Default::default()
            },
        };
        let request = EngineRequest {
            generation: GenerationRequest {
                prompt: job.prompt.clone(),
                max_tokens,
                sampling,
                eos_ids: eos_ids.to_vec(),
                ..Default::default()
            },
            speculative: RequestSpeculation::default(),
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
        };
        let stream = engine.submit(request).await?;
        pending.push(tokio::spawn(stream.collect()));
    }
    let mut answers = Vec::with_capacity(total);
    for (job, done) in jobs.iter().zip(pending) {
        let out = done
            .await
            .map_err(|e| TrainError::Options(format!("an answer's task failed: {e}")))??;
        answers.push(Answer {
            tokens: [job.prompt.as_slice(), &out.tokens].concat(),
            answer_from: job.prompt.len(),
            sampled: job.seed.is_some(),
        });
        progress(answers.len(), total);
    }
    Ok(answers)
}

/// Every token the answers contain, most frequent first (ties by id): a draft vocabulary of
/// K tokens is the first K.
pub fn token_rank(answers: &[Answer], vocab: usize) -> Vec<u32> {
    let mut counts = vec![0u64; vocab];
    for a in answers {
        for &t in &a.tokens[a.answer_from..] {
            if let Some(c) = counts.get_mut(t as usize) {
                *c += 1;
            }
        }
    }
    let mut seen: Vec<u32> = (0..vocab as u32)
        .filter(|&t| counts[t as usize] > 0)
        .collect();
    seen.sort_by_key(|&t| (std::cmp::Reverse(counts[t as usize]), t));
    seen
}

/// The target's features (last hidden state after the final norm) along texts: each text's
/// are computed after the last one's, reusing the positions it shares with it from the start
/// (a question's answers share its prompt; a second turn, its first), so `texts` in sorted
/// order costs each shared prefix once.
pub struct FeatureRunner<'a> {
    target: &'a Decoder,
    taps: FeatureTaps,
    cache: KvCache,
    last: Vec<u32>,
    last_features: Vec<f32>,
}

impl<'a> FeatureRunner<'a> {
    /// A runner of the features `taps` names.
    pub fn new(target: &'a Decoder, taps: FeatureTaps) -> Result<Self, TrainError> {
        let mut cache = target.new_cache(1);
        cache.allocate_slot(0)?;
        Ok(Self {
            target,
            taps,
            cache,
            last: Vec::new(),
            last_features: Vec::new(),
        })
    }

    /// The features at every token of `tokens`, a row each.
    pub fn features(&mut self, tokens: &[u32]) -> Result<&[f32], TrainError> {
        // At least the last token is run again, so that a text that is a prefix of the last
        // one still comes out of one forward of its own.
        let shared = common_prefix(&self.last, tokens).min(tokens.len().saturating_sub(1));
        self.cache.keep(0, Kept::First(shared))?;
        let (_, f) = self.target.forward_with_features(
            &mut self.cache,
            &[SeqInput {
                slot: 0,
                start_pos: shared,
                tokens: &tokens[shared..],
                logits: LogitsRows::None,
                parents: &[],
            }],
            &self.taps,
        )?;
        self.last_features.truncate(shared * f.hidden());
        self.last_features.extend_from_slice(f.seq(0));
        self.last.clear();
        self.last.extend_from_slice(tokens);
        Ok(&self.last_features)
    }
}
