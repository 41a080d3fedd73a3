//! What a decoder model is, as data: its hyperparameters, its block as a family declares it,
//! and how its rotary embeddings are laid out and scaled. The leaf of the model layer: every
//! other part (the file readers, the families, the forward) uses it, and it uses none of them.

pub mod block;
pub mod hparams;
pub mod rope;
