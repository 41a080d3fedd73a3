//! What one training step reads and reports: a sequence the target wrote with its features,
//! and the losses over it.
//!
//! Why it exists: the training run (`crate::train`) builds samples and reads losses; it needs
//! these two shapes and nothing of the trainer's insides.

/// One training sequence: tokens the target read or wrote, from position `start` of their
/// text on, and the target's features (computed over the whole text) at each of them, a row
/// of [`super::HeadTrainer::feature_width`] each: its last hidden state after the final norm
/// (EAGLE), or its three taps and its last layer's output (EAGLE-3).
pub struct TrainSample {
    pub start: usize,
    pub tokens: Vec<u32>,
    pub features: Vec<f32>,
}

/// Losses of one sequence: the weighted total, its two parts, and how often the head's top
/// token is the target's (teacher-forced, one step ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Losses {
    pub total: f32,
    pub feature: f32,
    pub token: f32,
    pub top1: f32,
    /// The same two steps ahead, the head fed its own first step (evaluation only, or when
    /// the second step is trained).
    pub top1_second: f32,
    pub positions: usize,
}
