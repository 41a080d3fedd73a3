//! The training data: the target's own answers to chat prompts (greedy, and sampled), the
//! frequency ranking of the tokens it wrote (the draft vocabulary), and the target's features
//! along each answer.

use serde::{Deserialize, Serialize};

use super::TrainError;
use std::sync::Arc;

use crate::engine::{Engine, EngineConfig, EngineRequest, GenerationRequest, RequestSpeculation};
use crate::model::{KvCache, Llama, LogitsRows, SeqInput};
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

/// The target's answers to every prompt: one greedy and `sampled` sampled at `temperature`,
/// each up to `max_tokens`, sampled ones seeded by `seed` and their place. They are decoded by
/// the engine, `concurrency` at a time (a sequence's tokens do not depend on its batch);
/// `progress(done, total)` as they finish, in order.
pub async fn answer_prompts(
    target: Arc<Llama>,
    prompts: &[Vec<u32>],
    (max_tokens, eos_ids): (usize, &[u32]),
    (sampled, temperature, seed): (usize, f32, u64),
    (concurrency, threads): (usize, usize),
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Answer>, TrainError> {
    let total = prompts.len() * (1 + sampled);
    let cfg = EngineConfig {
        max_seqs: concurrency.max(1),
        max_queue: total.max(1),
        target_threads: threads.max(1),
        draft_threads: 1,
        ..EngineConfig::default()
    };
    let engine = Engine::start(target, None, cfg).await?;
    let mut pending = Vec::with_capacity(total);
    for (i, prompt) in prompts.iter().enumerate() {
        for j in 0..=sampled {
            let sampling = if j == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature,
                    seed: Some(seed.wrapping_add((i * 1000 + j) as u64)),
                    ..Default::default()
                }
            };
            let request = EngineRequest {
                generation: GenerationRequest {
                    prompt: prompt.clone(),
                    max_tokens,
                    sampling,
                    eos_ids: eos_ids.to_vec(),
                    ..Default::default()
                },
                speculation: RequestSpeculation::default(),
                logprobs: None,
                prompt_logprobs: None,
                constraint: None,
            };
            let stream = engine.submit(request).await?;
            pending.push((i, j > 0, tokio::spawn(stream.collect())));
        }
    }
    let mut answers = Vec::with_capacity(total);
    for (i, was_sampled, done) in pending {
        let out = done
            .await
            .map_err(|e| TrainError::Options(format!("an answer's task failed: {e}")))??;
        answers.push(Answer {
            tokens: [prompts[i].as_slice(), &out.tokens].concat(),
            answer_from: prompts[i].len(),
            sampled: was_sampled,
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

/// The target's features (last hidden state after the final norm) at every token of
/// `tokens`, `tokens × hidden`, from one forward in a fresh slot of `cache`.
pub fn features(
    target: &Llama,
    cache: &mut KvCache,
    tokens: &[u32],
) -> Result<Vec<f32>, TrainError> {
    if cache.is_allocated(0) {
        cache.free(0)?;
    }
    cache.allocate_slot(0)?;
    let (_, f) = target.forward_with_features(
        cache,
        &[SeqInput {
            slot: 0,
            start_pos: 0,
            tokens,
            logits: LogitsRows::None,
            parents: &[],
        }],
    )?;
    cache.free(0)?;
    Ok(f.seq(0).to_vec())
}
