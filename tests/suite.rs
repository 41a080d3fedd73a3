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

/// With `autotests = false`, a test file that is neither a module here nor a `[[test]]` target
/// would never be compiled, and its tests would pass by never running.
#[test]
fn every_test_file_is_built() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let (suite, manifest) = (read("tests/suite.rs"), read("Cargo.toml"));
    let mut unbuilt = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let module = suite.lines().any(|l| l == format!("mod {stem};"));
        let target = manifest.contains(&format!("path = \"tests/{name}\""));
        if !module && !target {
            unbuilt.push(name);
        }
    }
    assert!(unbuilt.is_empty(), "never built: {unbuilt:?}");
}
