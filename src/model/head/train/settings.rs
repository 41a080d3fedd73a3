//! How a head is trained: the optimizer's rate and schedule, the losses' weights, the input
//! noise, and the seed.
//!
//! Why it exists: `tandem train-head` sets these from its flags and the training run passes
//! them through unchanged; EAGLE's published values are the defaults.

/// How the head is trained.
#[derive(Clone, Debug)]
pub struct TrainSettings {
    /// The peak learning rate: a run warms up to it over `warmup_steps` steps, then decays it
    /// along a cosine to a tenth by its last step.
    pub learning_rate: f64,
    pub warmup_steps: usize,
    pub weight_decay: f64,
    /// Gradients are scaled down to this global norm when longer (0: never); without it a
    /// rare long, surprising sequence can throw a trained head off.
    pub clip_norm: f64,
    /// Weight of the feature regression and of the token loss (EAGLE: 1.0 and 0.1).
    pub feature_weight: f64,
    pub token_weight: f64,
    /// Weight of the same two losses one step further (EAGLE-3's training-time test): the
    /// head fed its own first step's feature, as a chain's second draft is (0: not trained).
    pub second_step_weight: f64,
    /// Uniform noise of this width added to the input features (EAGLE: 0.2).
    pub noise: f32,
    /// Positions of a sequence trained on: a longer one is trained on its last ones (its
    /// answer and what precedes it), at their own positions.
    pub max_positions: usize,
    pub seed: u64,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            learning_rate: 1e-3,
            warmup_steps: 200,
            weight_decay: 0.0,
            clip_norm: 0.5,
            feature_weight: 1.0,
            token_weight: 0.1,
            second_step_weight: 0.0,
            noise: 0.2,
            max_positions: 640,
            seed: 0,
        }
    }
}
