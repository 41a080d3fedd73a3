//! The load signals under vLLM's metric names, beside tandem's own.
//!
//! Why it exists: routers and endpoint pickers that balance a fleet (smg's `/metrics`
//! fallback, the Gateway API Inference Extension's endpoint picker, llm-d) read vLLM's gauges
//! by name: the requests running and waiting and the KV cache's use. Exported under those names
//! with vLLM's `model_name` label, tandem is balanced by them as vLLM is, with nothing
//! configured. They are the same numbers as `tandem_requests_running`,
//! `tandem_requests_waiting`, `tandem_kv_cache_usage_ratio{model="target"}` and the prefix
//! cache's token counters.

use std::sync::OnceLock;

use metrics::{counter, gauge};

use super::names::*;

/// The served model's name (the `model_name` label), once the server knows it; until then
/// nothing is exported under vLLM's names.
static MODEL_NAME: OnceLock<String> = OnceLock::new();

/// Starts exporting the aliases for `model_name`, each at zero until its first sample.
pub fn register_vllm_aliases(model_name: &str) {
    if MODEL_NAME.set(model_name.to_string()).is_err() {
        return;
    }
    set_vllm_queue(0, 0);
    set_vllm_kv_usage(0.0);
    record_vllm_prefix_lookup(0, 0);
}

pub(super) fn set_vllm_queue(running: usize, waiting: usize) {
    if let Some(name) = MODEL_NAME.get() {
        gauge!(VLLM_REQUESTS_RUNNING, "model_name" => name.clone()).set(running as f64);
        gauge!(VLLM_REQUESTS_WAITING, "model_name" => name.clone()).set(waiting as f64);
    }
}

pub(super) fn set_vllm_kv_usage(ratio: f64) {
    if let Some(name) = MODEL_NAME.get() {
        gauge!(VLLM_KV_CACHE_USAGE, "model_name" => name.clone()).set(ratio.clamp(0.0, 1.0));
    }
}

pub(super) fn record_vllm_prefix_lookup(queried_tokens: usize, hit_tokens: usize) {
    if let Some(name) = MODEL_NAME.get() {
        counter!(VLLM_PREFIX_QUERIES, "model_name" => name.clone())
            .increment(queried_tokens as u64);
        counter!(VLLM_PREFIX_HITS, "model_name" => name.clone()).increment(hit_tokens as u64);
    }
}
