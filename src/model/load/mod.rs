pub mod hparams;
pub mod loader;
pub mod weights;
