//! Llama GGUF files made on this machine: random weights at a named shape, or an existing
//! model's weights re-quantized, under a recipe of weight types that follows llama.cpp's.
//!
//! Why it exists: the seeds' models (and the K-quant files users download) do not reach our
//! machines, yet a kernel's speed at their shapes and its correctness on their weight types are
//! what users meet. Random weights time a forward as honestly as real ones; re-quantizing the
//! default model gives real weights in any type, made in a test without downloads or
//! llama.cpp. Random-weight files are for timing only: their text is noise.

pub mod make;
pub mod recipe;
pub mod shapes;

pub use make::{make_model, Made, WeightSource};
pub use recipe::Recipe;
pub use shapes::Shape;
