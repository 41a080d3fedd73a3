//! The name of every metric tandem exports.
//!
//! Why it exists: dashboards, alert rules and tests refer to these names; defining each once,
//! apart from where it is recorded and described, keeps them from drifting.

pub const REQUESTS_TOTAL: &str = "tandem_requests_total";
pub const PROMPT_TOKENS_TOTAL: &str = "tandem_prompt_tokens_total";
pub const GENERATION_TOKENS_TOTAL: &str = "tandem_generation_tokens_total";
pub const SPEC_NUM_DRAFTS: &str = "tandem_spec_decode_num_drafts_total";
pub const SPEC_NUM_DRAFT_TOKENS: &str = "tandem_spec_decode_num_draft_tokens_total";
pub const SPEC_NUM_ACCEPTED_TOKENS: &str = "tandem_spec_decode_num_accepted_tokens_total";
pub const SPEC_ACCEPTED_PER_POS: &str = "tandem_spec_decode_num_accepted_tokens_per_pos_total";
pub const SPEC_DRAFT_AHEAD: &str = "tandem_spec_draft_ahead_total";
pub const SPEC_DRAFT_GATE_STOPS: &str = "tandem_spec_draft_gate_stops_total";
pub const SPEC_DRAFT_ENTROPY: &str = "tandem_spec_draft_entropy";
pub const SPEC_TREE_ROUNDS: &str = "tandem_spec_tree_rounds_total";
pub const SPEC_TREE_BRANCH_ACCEPTS: &str = "tandem_spec_tree_branch_accepts_total";
pub const SPEC_TREE_NODES: &str = "tandem_spec_tree_nodes";
pub const SPEC_SAMPLED_POSITIONS: &str = "tandem_spec_sampled_positions_total";
pub const SPEC_SAMPLED_STAND: &str = "tandem_spec_sampled_stand_thousandths_total";
pub const CONSTRAINED_REQUESTS: &str = "tandem_constrained_requests_total";
pub const SPEC_FORCED_TOKENS: &str = "tandem_spec_forced_tokens_total";
pub const SPEC_FORCED_ACCEPTED: &str = "tandem_spec_forced_accepted_tokens_total";
pub const CONSTRAINT_MASK_SECONDS: &str = "tandem_constraint_mask_seconds";
pub const CONSTRAINT_TOO_COMPLEX: &str = "tandem_constraint_too_complex_total";

pub const REQUEST_ACCEPTANCE_RATE: &str = "tandem_request_acceptance_rate";
pub const SPEC_ACCEPTED_LENGTH: &str = "tandem_spec_decode_accepted_length";
pub const DRAFT_STEP_SECONDS: &str = "tandem_draft_step_seconds";
pub const VERIFY_STEP_SECONDS: &str = "tandem_verify_step_seconds";
pub const ROUND_SECONDS: &str = "tandem_round_seconds";
pub const TTFT_SECONDS: &str = "tandem_time_to_first_token_seconds";
pub const INTER_TOKEN_SECONDS: &str = "tandem_inter_token_seconds";
pub const REQUEST_DURATION_SECONDS: &str = "tandem_request_duration_seconds";
pub const PREFILL_SECONDS: &str = "tandem_prefill_seconds";

pub const REQUESTS_RUNNING: &str = "tandem_requests_running";
pub const REQUESTS_WAITING: &str = "tandem_requests_waiting";
pub const KV_CACHE_USAGE: &str = "tandem_kv_cache_usage_ratio";
pub const SPEC_LENIENCE: &str = "tandem_spec_lenience";
pub const SPEC_GAMMA: &str = "tandem_spec_gamma";
pub const PIPELINE_OVERLAP: &str = "tandem_pipeline_overlap_ratio";
pub const SPEC_SPEEDUP_ESTIMATE: &str = "tandem_spec_speedup_estimate";
pub const SPEC_DRAFTING_NET: &str = "tandem_spec_drafting_net_seconds";

pub const CONFIG_RELOADS: &str = "tandem_config_reloads_total";
pub const ENGINE_STALLS: &str = "tandem_engine_stalls_total";
/// Sequences whose forward gave NaN or infinite logits through no setting of their request.
pub const NON_FINITE_FORWARDS: &str = "tandem_non_finite_forwards_total";
pub const ENGINE_ROUND_AGE: &str = "tandem_engine_round_age_seconds";
pub const ENGINE_STALLED: &str = "tandem_engine_stalled";
pub const REQUESTS_REFUSED: &str = "tandem_requests_refused_total";
pub const PREFIX_LOOKUPS: &str = "tandem_prefix_cache_lookups_total";
pub const PREFIX_HITS: &str = "tandem_prefix_cache_hits_total";
pub const PREFIX_HIT_TOKENS: &str = "tandem_prefix_cache_hit_tokens_total";
pub const PREFIX_EVICTIONS: &str = "tandem_prefix_cache_evictions_total";
pub const PREFIX_RUNS: &str = "tandem_prefix_cache_runs";
pub const PREFIX_TOKENS: &str = "tandem_prefix_cache_tokens";
pub const PREFIX_BYTES: &str = "tandem_prefix_cache_bytes";
pub const PREFIX_BUDGET_BYTES: &str = "tandem_prefix_cache_budget_bytes";

/// vLLM's names for the load signals routers and endpoint pickers read (smg, vllm-router, the
/// Gateway API Inference Extension), exported beside tandem's own with vLLM's `model_name`
/// label (`vllm_aliases`).
pub const VLLM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
pub const VLLM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// A ratio in 0..=1, as vLLM's is despite its name.
pub const VLLM_KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// Prompt tokens the prefix cache was asked for, and those it held.
pub const VLLM_PREFIX_QUERIES: &str = "vllm:prefix_cache_queries_total";
pub const VLLM_PREFIX_HITS: &str = "vllm:prefix_cache_hits_total";
