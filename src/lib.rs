//! tandem: an LLM inference server built around speculative decoding.
//!
//! Layers, lowest first (an upper layer may use a lower one, never the reverse):
//! `model` (tensors, KV cache, tokenizer), `sampling` (pure logits processing and speculative
//! acceptance), `draft` (drafters), `engine`
//! (generation loops and, later, the actors), then the CLI in `main.rs`.

pub mod bench;
pub mod config;
pub mod draft;
pub mod engine;
pub mod logging;
pub mod model;
pub mod runtime;
pub mod sampling;
pub mod server;
pub mod setup;
pub mod telemetry;
