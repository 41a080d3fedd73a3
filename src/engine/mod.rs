//! The engine: generation on top of the model, sampling and draft layers.
//!
//! - The foundation every part shares: the error type (`error`), what a request is and yields
//!   (`request`), γ and its cap (`gamma`), the verification step (`verify`), the stop
//!   conditions (`emitter`, `stop`), and the live speculation settings (`settings`).
//! - The single-sequence reference loops (`reference`): plain decoding, the reference, and
//!   speculative decoding with a fixed γ, which must reproduce it.
//! - The serving engine (`handle::Engine`): kameo actors — `Scheduler`, `Drafter`, `Verifier`,
//!   `CacheManager` (`messages` holds what they say to each other) — with compute workers
//!   (`worker`) for forward passes, continuous batching, pipelining and the speed `governor`;
//!   its heartbeat (`liveness`) and the `watchdog` that reads it.

pub mod acceptance;
mod batch_drafter;
pub mod cache_manager;
mod calibration;
pub mod drafter;
pub mod emitter;
pub mod error;
mod event_stream;
pub mod gamma;
pub mod governor;
pub mod handle;
mod kv_room;
pub mod liveness;
mod lookup_drafter;
pub mod messages;
mod plain_run;
pub mod prefill_timing;
pub mod prefix_budget;
pub mod price_memory;
pub mod reference;
pub mod request;
pub mod scheduler;
pub mod speculation_knobs;
pub mod speculation_settings;
pub mod stop;
mod target_round;
pub mod token_source;
pub mod tree_nodes;
pub mod verifier;
mod watchdog;
pub mod worker;

pub use batch_drafter::BatchDrafter;
pub use calibration::{PricesFrom, StartUpPrices};
pub use error::EngineError;
pub use event_stream::{Completion, EventStream};
pub use gamma::{gamma_cap, Gamma, GammaPolicy, InvalidGamma};
pub use handle::{Engine, EngineConfig};
pub use liveness::EngineHealth;
pub use messages::{
    CacheStats, EngineEvent, Failure, SchedulerStats, GRAMMAR_TOO_COMPLEX, NON_FINITE_LOGITS,
};
pub use price_memory::PriceMemory;
pub use reference::{generate_plain, generate_speculative, FixedSpeculation};
pub use request::{
    EngineRequest, FinishReason, GenerationOutput, GenerationRequest, GenerationStats, OnOutput,
    OutputPiece, SpeculationStats, Usage,
};
pub use speculation_knobs::SpeculationKnobs;
pub use speculation_settings::{
    LiveSpeculation, RequestSpeculation, RoundSpeculation, SettingsError, SpeculationSettings,
};
pub use token_source::{SourceRun, TokenSource};
pub use tree_nodes::TreeNodes;
