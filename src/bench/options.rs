//! What a benchmark run is asked to do: its modes, sampling, load and repeats.
//!
//! Why it exists: the run loop and each question's turns both read these settings; kept apart
//! from the loop, a question's file can use them without importing the loop that calls it.

use crate::constraint::JsonWhitespace;
use crate::sampling::SamplingParams;

use super::mode::Mode;

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub modes: Vec<Mode>,
    /// How structured modes lay out JSON (`structured.json_whitespace`).
    pub json_whitespace: JsonWhitespace,
    pub max_tokens: usize,
    /// Temperature 0 = greedy (outputs are then compared with plain decoding's).
    pub sampling: SamplingParams,
    /// Base seed; each question, turn and repeat derives its own from it (the same in every
    /// mode).
    pub seed: u64,
    pub ignore_eos: bool,
    pub concurrency: usize,
    pub repeat: usize,
    pub warmup: usize,
    /// Compute threads in all.
    pub threads: usize,
    pub max_gamma: usize,
    pub prefill_chunk: usize,
    /// A system message before every question (a templated workload: every prompt opens the
    /// same way).
    pub system_prompt: Option<String>,
}
