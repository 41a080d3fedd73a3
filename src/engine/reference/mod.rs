//! The single-sequence reference loops: plain decoding, the reference every other path must
//! reproduce, and speculative decoding of one sequence with a fixed γ. They run on the caller's
//! thread with no actors, which makes them the ground truth the tests compare the actor engine
//! against, and the simplest way to use the engine as a library.

mod plain;
mod speculative;
mod steps;

pub use plain::generate_plain;
pub use speculative::{generate_speculative, FixedSpeculation};
