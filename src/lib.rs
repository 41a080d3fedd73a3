//! tandem: an LLM inference server built around speculative decoding.
//!
//! Layers, lowest first (an upper layer may use a lower one, never the reverse): `model`
//! (kernels, KV cache, forward pass, tokenizer, chat template), `sampling` (pure logits
//! processing and speculative acceptance), `constraint` (structured outputs: grammar masks and
//! forced tokens through llguidance), `draft` (drafters), `engine` (the reference
//! generation loops and the actor engine: scheduler, drafter, verifier, cache manager,
//! governor), then `server` (the HTTP API). Beside them: `config`, `setup`, `telemetry`,
//! `logging`, `bench`, `runtime` and `huge_pages`. The command-line interface lives in the binary
//! (`src/main.rs` and `src/cli/`).

pub mod bench;
pub mod config;
pub mod constraint;
pub mod draft;
pub mod engine;
pub mod huge_pages;
pub mod logging;
pub mod memory_budget;
pub mod model;
pub mod price_identity;
pub mod runtime;
pub mod sampling;
pub mod server;
pub mod setup;
pub mod telemetry;
pub mod train;
