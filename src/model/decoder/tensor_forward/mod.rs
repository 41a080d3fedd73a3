//! The forward on candle tensors, for any candle device (a GPU above all; the CPU device runs
//! it in tests against the own kernels).
//!
//! The same decoder as `own_forward`, built from candle's operations: quantized or dense matmuls
//! (`Linear`), `rms_norm`, rotary embeddings per token (each token has its own position, since
//! sequences of different lengths share one pass), SiLU, and attention over a cache of device
//! tensors (`attention`). Linear layers run on all new tokens of all sequences at once;
//! attention runs per sequence.

mod attention;
mod pass;
mod rope_tensors;

pub(crate) use pass::forward;
pub(crate) use rope_tensors::TensorRopes;
