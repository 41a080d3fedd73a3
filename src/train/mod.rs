//! `tandem train-head`: a draft head for a loaded target, trained on this machine's CPU from
//! the target's own answers (to the development prompts and to prompts it writes itself).
//!
//! Why it exists apart from `model::head::train` (the differentiable forward and the optimizer
//! step): making the data takes the engine's plain decoding loop and chat prompts, and a run
//! is a job with files (answers, checkpoints, a training curve) that can stop and resume. Like
//! `bench`, it starts the layers below it and nothing below imports it.

mod data;
mod error;
mod run;
mod self_prompts;

pub use data::{answer_jobs, answer_prompts, token_rank, Answer, AnswerJob, FeatureRunner};
pub use error::TrainError;
pub use run::{train_head, EpochPoint, TrainOptions, TrainReport};
pub use self_prompts::{finished_turn, user_turn_opening};
