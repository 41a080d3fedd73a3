//! The Prometheus exporter: installed once at server start, with each histogram's buckets and
//! each metric's help text.
//!
//! Why it exists: the buckets and help text are what `/metrics` shows beside the samples; they
//! are set up once, apart from the recording calls spread through the engine.

use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use super::names::*;

/// Step latencies span sub-millisecond GPU steps to seconds-long CPU prefills.
const STEP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
];
const RATIO_BUCKETS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];
const LENGTH_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
/// A grammar mask costs tens of microseconds to a few milliseconds.
const MASK_BUCKETS: &[f64] = &[
    0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1,
];

/// Installs the process-wide Prometheus recorder (once, at server start) and describes every
/// metric. The handle renders `/metrics`.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in [
        (DRAFT_STEP_SECONDS, STEP_BUCKETS),
        (VERIFY_STEP_SECONDS, STEP_BUCKETS),
        (ROUND_SECONDS, STEP_BUCKETS),
        (INTER_TOKEN_SECONDS, STEP_BUCKETS),
        (PREFILL_SECONDS, REQUEST_BUCKETS),
        (TTFT_SECONDS, REQUEST_BUCKETS),
        (REQUEST_DURATION_SECONDS, REQUEST_BUCKETS),
        (REQUEST_ACCEPTANCE_RATE, RATIO_BUCKETS),
        (SPEC_ACCEPTED_LENGTH, LENGTH_BUCKETS),
        (SPEC_DRAFT_ENTROPY, RATIO_BUCKETS),
        (SPEC_TREE_NODES, LENGTH_BUCKETS),
        (CONSTRAINT_MASK_SECONDS, MASK_BUCKETS),
    ] {
        b = b.set_buckets_for_metric(Matcher::Full(name.into()), buckets)?;
    }
    let handle = b.install_recorder()?;
    describe_requests();
    describe_speculation();
    describe_constraints();
    describe_engine();
    describe_prefix_cache();
    Ok(handle)
}

/// Requests' counts and the time they and their rounds take.
fn describe_requests() {
    describe_counter!(REQUESTS_TOTAL, "Finished requests by status.");
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens of admitted requests.");
    describe_counter!(GENERATION_TOKENS_TOTAL, "Tokens generated.");
    describe_histogram!(DRAFT_STEP_SECONDS, "Drafter time per round.");
    describe_histogram!(
        VERIFY_STEP_SECONDS,
        "Batched target forward time per round."
    );
    describe_histogram!(ROUND_SECONDS, "Wall time of one scheduler round.");
    describe_histogram!(TTFT_SECONDS, "Time from arrival to the first output token.");
    describe_histogram!(
        INTER_TOKEN_SECONDS,
        "Time between output tokens of a request."
    );
    describe_histogram!(REQUEST_DURATION_SECONDS, "Time from arrival to the end.");
    describe_histogram!(
        PREFILL_SECONDS,
        "Time from admission to the end of prefill."
    );
    describe_counter!(
        REQUESTS_REFUSED,
        "Requests the HTTP API answered with an error status, by reason (overloaded, invalid, unavailable, error)."
    );
}

/// How drafts fare: rounds, acceptance, the confidence gate, pipelining and trees.
fn describe_speculation() {
    describe_counter!(SPEC_NUM_DRAFTS, "Speculation rounds that verified drafts.");
    describe_counter!(SPEC_NUM_DRAFT_TOKENS, "Tokens drafted and verified.");
    describe_counter!(
        SPEC_NUM_ACCEPTED_TOKENS,
        "Drafted tokens the target accepted."
    );
    describe_counter!(
        SPEC_ACCEPTED_PER_POS,
        "Accepted drafted tokens by position in the round (0-based)."
    );
    describe_counter!(
        SPEC_DRAFT_AHEAD,
        "Next rounds drafted during a verification within a request (pipelining), by outcome: used (every draft stood and the guess of the target's token held) or discarded."
    );
    describe_histogram!(
        REQUEST_ACCEPTANCE_RATE,
        "Acceptance rate of each finished speculative request."
    );
    describe_histogram!(
        SPEC_ACCEPTED_LENGTH,
        "Tokens emitted per speculative round (accepted drafts + 1)."
    );
    describe_histogram!(
        SPEC_DRAFT_ENTROPY,
        "Normalized entropy of each next-token distribution the confidence gate judged (0 = certain drafter, 1 = uniform)."
    );
    describe_counter!(
        SPEC_DRAFT_GATE_STOPS,
        "Draft rounds the confidence gate ended early because the drafter was unsure."
    );
    describe_counter!(
        SPEC_TREE_ROUNDS,
        "Speculation rounds verified as a token tree (a chain with alternatives beside it)."
    );
    describe_counter!(
        SPEC_TREE_BRANCH_ACCEPTS,
        "Tree rounds whose accepted path left the drafted chain for an alternative."
    );
    describe_histogram!(
        SPEC_TREE_NODES,
        "Drafted nodes of each tree round, chain and alternatives together."
    );
    describe_counter!(
        SPEC_SAMPLED_POSITIONS,
        "Sampled requests' verified draft positions measured for each proposal: drawn from the drafter's distribution (drawn), or its likeliest token (likeliest)."
    );
    describe_counter!(
        SPEC_SAMPLED_STAND,
        "Summed probability, in thousandths, that each proposal's draft stands at those positions: over 1000 x spec_sampled_positions_total, how often it would stand."
    );
}

/// Structured outputs: constrained requests, forced drafts, the grammar's cost.
fn describe_constraints() {
    describe_counter!(
        CONSTRAINED_REQUESTS,
        "Requests admitted with a structured-output constraint, by kind (json_object, json_schema, regex, choice, grammar, tools)."
    );
    describe_counter!(
        SPEC_FORCED_TOKENS,
        "Drafts the grammar of a constrained request forced (also counted as drafted tokens)."
    );
    describe_counter!(
        SPEC_FORCED_ACCEPTED,
        "Forced drafts the target accepted (also counted as accepted tokens)."
    );
    describe_histogram!(
        CONSTRAINT_MASK_SECONDS,
        "Time a constrained sequence's grammar took per round: drafts checked, forced tokens found, every row's mask computed."
    );
    describe_counter!(
        CONSTRAINT_TOO_COMPLEX,
        "Constraints found too complex, by stage: refused past the input limits (limits), compiling past structured.compile_timeout_ms (timeout), or a sequence ended past llguidance's per-token limits (generation)."
    );
}

/// The engine's state: its queue, cache use, live settings, health and reloads.
fn describe_engine() {
    describe_gauge!(REQUESTS_RUNNING, "Requests being decoded.");
    describe_gauge!(REQUESTS_WAITING, "Requests waiting for admission.");
    describe_gauge!(KV_CACHE_USAGE, "Reserved share of the KV cache, by model.");
    describe_gauge!(SPEC_LENIENCE, "Current server-wide lenience (1 = exact).");
    describe_gauge!(
        SPEC_GAMMA,
        "Current fixed γ, or γmax when adaptive; 0 when off."
    );
    describe_gauge!(
        SPEC_SPEEDUP_ESTIMATE,
        "Decode speed over plain decoding's, from recent rounds and measured costs (<1: speculation loses)."
    );
    describe_gauge!(
        SPEC_DRAFTING_NET,
        "Seconds drafting saved against plain decoding over about the last minute of decoding, net (<0: lost; below -0.3 exploring is priced at face value)."
    );
    describe_gauge!(
        PIPELINE_OVERLAP,
        "Share of busy time the drafter and verifier ran at once."
    );
    describe_counter!(
        ENGINE_STALLS,
        "Times the watchdog found work waiting and no engine round for longer than engine.stall_timeout_seconds (/health turns 503)."
    );
    describe_gauge!(
        ENGINE_STALLED,
        "1 while the engine is stalled or its scheduler has stopped (/health answers 503), else 0."
    );
    describe_gauge!(
        ENGINE_ROUND_AGE,
        "Seconds since the engine last finished a round while work waits; 0 while idle."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Reloads of the config file's speculation settings, by result (ok, error)."
    );
}

/// The prefix cache, per model.
fn describe_prefix_cache() {
    describe_counter!(
        PREFIX_LOOKUPS,
        "New sequences that looked for a cached prompt prefix, by model."
    );
    describe_counter!(
        PREFIX_HITS,
        "New sequences that started from a cached prompt prefix, by model."
    );
    describe_counter!(
        PREFIX_HIT_TOKENS,
        "Prompt tokens taken from the prefix cache instead of prefilled, by model."
    );
    describe_counter!(
        PREFIX_EVICTIONS,
        "Token runs evicted from the prefix cache (least recently used first) to keep it within its budget, by model."
    );
    describe_gauge!(
        PREFIX_RUNS,
        "Token runs in the prefix cache's tree (a shared start is one run), by model."
    );
    describe_gauge!(
        PREFIX_TOKENS,
        "Tokens whose keys and values the prefix cache holds, by model."
    );
    describe_gauge!(
        PREFIX_BYTES,
        "Bytes of keys and values the prefix cache holds, by model."
    );
    describe_gauge!(
        PREFIX_BUDGET_BYTES,
        "The most bytes the prefix cache may hold (engine.prefix_cache_mib, shared by the models in proportion to their bytes per token), by model."
    );
}
