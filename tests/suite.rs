//! Most integration tests, as modules of one test binary: a binary links the whole library and
//! compiles `common` anew, and 35 of them took 182 s to build on 2 cores where one takes 65 s.
//! A test file here runs alone as `cargo test --test suite FILE::` (e.g. `server::`).
//!
//! Three files stay binaries of their own (Cargo.toml's `[[test]]` entries): two change what is
//! global to a process before their tests run (`sampled_distribution` sizes candle's thread
//! pool, `model_oracle` sets `CANDLE_DEQUANTIZE_ALL`), and `tensor_backend` is what the GPU
//! checks build and carry alone.

mod common;

mod architecture;
mod bench;
mod cache_algebra;
mod client_libraries;
mod cross_vocabulary;
mod deployment;
mod draft_head;
mod engine;
mod families;
mod first_hour;
mod fleet;
mod gemma3;
mod harmony;
mod hostile_clients;
mod hostile_files;
mod hostile_grammars;
mod k_quants;
mod load_signals;
mod logprobs_and_choices;
mod observability;
mod portable;
mod prefix_cache;
mod real_model;
mod responses_api;
mod router;
mod server;
mod speculative;
mod structured_outputs;
mod tenancy;
mod tokenizer;
mod tool_calls;
mod web_page;
