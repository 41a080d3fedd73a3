//! Test support: tiny random Llama models written to disk in Hugging Face layout, the real
//! default model, prompts, the requests tests send and how they run them, and the checks
//! several test files share. The test binaries of their own (`sampled_distribution`,
//! `model_oracle`, `tensor_backend`) compile all of it and use a part: hence `dead_code` allowed.

#![allow(dead_code)]

mod cli;
mod default_model;
mod forward_checks;
pub mod http;
mod prompts;
mod requests;
mod runs;
pub mod stats;
mod tiny_model;

// The items callers name as `common::…`; a test binary that uses none of a file's items would
// otherwise warn of an unused import.
#[allow(unused_imports)]
pub use cli::tandem_command;
#[allow(unused_imports)]
pub use default_model::{
    default_model, gemma_path, load_default, load_default_on, load_default_with, test_device,
};
#[allow(unused_imports)]
pub use forward_checks::{
    batched_equals_alone, forward_rows, kl_divergence, tree_equals_its_paths, tree_path, TEST_TREE,
};
#[allow(unused_imports)]
pub use prompts::{chat_prompt, development_text, random_tokens, spec_bench_prompts};
#[allow(unused_imports)]
pub use requests::{engine_request, fixed_gamma, generation_request, greedy_request};
#[allow(unused_imports)]
pub use runs::{complete_together, one_at_a_time, plain_output, runtime, speculation_equals_plain};
#[allow(unused_imports)]
pub use tiny_model::{
    byte_level_tokenizer_json, load_tiny, load_tiny_on, random_eagle3_head, write_tiny_blend,
    write_tiny_llama, write_tiny_tokenizer, write_tiny_tokenizer_swapped, TinySpec,
};
