//! Every Prometheus metric tandem exports, defined in one place (docs/operations.md, "Metrics").
//!
//! Why it exists: dashboards, alert rules and tests refer to these names, so they must not drift
//! between the places that record them. Recording goes through the `metrics` facade; without an
//! installed recorder (the library in tests, `tandem generate`) it costs next to nothing. The
//! speculation counters are named after vLLM's (`vllm:spec_decode_num_drafts` is
//! `tandem_spec_decode_num_drafts_total` here): a query written for vLLM needs only its prefix
//! changed.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

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

pub const CONFIG_RELOADS: &str = "tandem_config_reloads_total";
pub const ENGINE_STALLS: &str = "tandem_engine_stalls_total";
pub const ENGINE_ROUND_AGE: &str = "tandem_engine_round_age_seconds";
pub const ENGINE_STALLED: &str = "tandem_engine_stalled";
pub const REQUESTS_REFUSED: &str = "tandem_requests_refused_total";
pub const PREFIX_LOOKUPS: &str = "tandem_prefix_cache_lookups_total";
pub const PREFIX_HITS: &str = "tandem_prefix_cache_hits_total";
pub const PREFIX_HIT_TOKENS: &str = "tandem_prefix_cache_hit_tokens_total";
pub const PREFIX_EVICTIONS: &str = "tandem_prefix_cache_evictions_total";
pub const PREFIX_RETAINED_SLOTS: &str = "tandem_prefix_cache_retained_slots";
pub const PREFIX_RETAINED_TOKENS: &str = "tandem_prefix_cache_retained_tokens";

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
    describe();
    Ok(handle)
}

fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Finished requests by status.");
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens of admitted requests.");
    describe_counter!(GENERATION_TOKENS_TOTAL, "Tokens generated.");
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
    describe_histogram!(DRAFT_STEP_SECONDS, "Drafter time per round.");
    describe_histogram!(
        SPEC_DRAFT_ENTROPY,
        "Normalized entropy of each next-token distribution the confidence gate judged (0 = certain drafter, 1 = uniform)."
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
    describe_counter!(
        SPEC_DRAFT_GATE_STOPS,
        "Draft rounds the confidence gate ended early because the drafter was unsure."
    );
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
        REQUESTS_REFUSED,
        "Requests the HTTP API answered with an error status, by reason (overloaded, invalid, unavailable, error)."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Reloads of the config file's speculation settings, by result (ok, error)."
    );
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
        "Retained slots evicted (least recently used) to make room, by model."
    );
    describe_gauge!(
        PREFIX_RETAINED_SLOTS,
        "Cache slots kept for their prefix after their sequence ended, by model."
    );
    describe_gauge!(
        PREFIX_RETAINED_TOKENS,
        "Tokens held by retained slots, by model."
    );
}

/// Exports the per-position acceptance counter at zero for every position a round can draft
/// (0 to `max_gamma` − 1), so its dashboard panel shows zeros, not "no data", on a server whose
/// drafts have all been rejected so far.
pub fn register_positions(max_gamma: usize) {
    for label in POSITIONS.iter().take(max_gamma.min(POSITIONS.len())) {
        counter!(SPEC_ACCEPTED_PER_POS, "position" => *label).increment(0);
    }
}

/// Exports the speculation counters at zero from the start. A counter that first appears
/// mid-workload has a first sample far from zero, and `rate()` extrapolates each series from
/// its own first sample: the acceptance rate as a ratio of two rates (the dashboard's, the
/// alert rule's) would then drift from the true ratio.
pub fn register_speculation() {
    for name in [
        SPEC_NUM_DRAFTS,
        SPEC_NUM_DRAFT_TOKENS,
        SPEC_NUM_ACCEPTED_TOKENS,
    ] {
        counter!(name).increment(0);
    }
}

/// One speculation round of one request: `drafted` drafts of which the first `accepted` stood.
pub fn record_round(drafted: usize, accepted: usize) {
    if drafted == 0 {
        return;
    }
    counter!(SPEC_NUM_DRAFTS).increment(1);
    counter!(SPEC_NUM_DRAFT_TOKENS).increment(drafted as u64);
    counter!(SPEC_NUM_ACCEPTED_TOKENS).increment(accepted as u64);
    for pos in 0..accepted {
        counter!(SPEC_ACCEPTED_PER_POS, "position" => POSITIONS[pos.min(POSITIONS.len() - 1)])
            .increment(1);
    }
    histogram!(SPEC_ACCEPTED_LENGTH).record((accepted + 1) as f64);
}

/// The confidence gate judged a next-token distribution of this normalized entropy.
pub fn record_draft_entropy(entropy: f32) {
    histogram!(SPEC_DRAFT_ENTROPY).record(f64::from(entropy));
}

/// The confidence gate ended a round's drafting early.
pub fn record_draft_gate_stop() {
    counter!(SPEC_DRAFT_GATE_STOPS).increment(1);
}

/// Exports the gate's counter at 0 from the start, so a rate over it exists before it fires.
pub fn register_draft_gate() {
    counter!(SPEC_DRAFT_GATE_STOPS).increment(0);
}

/// Exports the tree counters at 0 from the start (see [`register_draft_gate`]).
pub fn register_trees() {
    counter!(SPEC_TREE_ROUNDS).increment(0);
    counter!(SPEC_TREE_BRANCH_ACCEPTS).increment(0);
}

/// Where a constraint can be found too complex (`record_constraint_too_complex`).
const TOO_COMPLEX_STAGES: [&str; 3] = ["limits", "timeout", "generation"];
/// The kinds of constraint a request can carry (`record_constrained_request`).
const CONSTRAINT_KINDS: [&str; 6] = [
    "json_object",
    "json_schema",
    "regex",
    "choice",
    "grammar",
    "tools",
];

/// Exports the structured-output series at 0 from the start (see [`register_draft_gate`]), so
/// the dashboard's panels show zeros rather than "no data" before the first constrained
/// request.
pub fn register_constraints() {
    counter!(SPEC_FORCED_TOKENS).increment(0);
    counter!(SPEC_FORCED_ACCEPTED).increment(0);
    for kind in CONSTRAINT_KINDS {
        counter!(CONSTRAINED_REQUESTS, "kind" => kind).increment(0);
    }
    for stage in TOO_COMPLEX_STAGES {
        counter!(CONSTRAINT_TOO_COMPLEX, "stage" => stage).increment(0);
    }
    // Registering the histogram exports it, with no samples yet.
    let _ = histogram!(CONSTRAINT_MASK_SECONDS);
}

/// A constraint was refused, or a sequence ended, because it was too complex: past the input
/// limits or llguidance's (`limits`), its compile past the deadline (`timeout`), or its
/// grammar past llguidance's per-token limits while generating (`generation`).
pub fn record_constraint_too_complex(stage: &'static str) {
    counter!(CONSTRAINT_TOO_COMPLEX, "stage" => stage).increment(1);
}

/// A request with a constraint of this kind was accepted.
pub fn record_constrained_request(kind: &'static str) {
    counter!(CONSTRAINED_REQUESTS, "kind" => kind).increment(1);
}

/// One round of a constrained sequence: its grammar's work before the target forward (drafts
/// checked, forced tokens, the rows' masks where sampling needs them) took `seconds`.
pub fn record_constraint_work(seconds: f64) {
    histogram!(CONSTRAINT_MASK_SECONDS).record(seconds);
}

/// A round's forced drafts: `forced` proposed, `accepted` of them stood.
pub fn record_forced(forced: usize, accepted: usize) {
    if forced > 0 {
        counter!(SPEC_FORCED_TOKENS).increment(forced as u64);
        counter!(SPEC_FORCED_ACCEPTED).increment(accepted as u64);
    }
}

/// A round verified as a tree of `nodes` drafted nodes; `branched`: its accepted path left the
/// chain.
pub fn record_tree_round(nodes: usize, branched: bool) {
    counter!(SPEC_TREE_ROUNDS).increment(1);
    counter!(SPEC_TREE_BRANCH_ACCEPTS).increment(u64::from(branched));
    histogram!(SPEC_TREE_NODES).record(nodes as f64);
}

/// Position labels as static strings (low cardinality: γ is bounded; the last one is "15+").
const POSITIONS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15+",
];

/// A finished request; `status` is a low-cardinality word ("stop", "length", "error", ...).
pub fn record_finished(status: &'static str, drafted: usize, accepted: usize, duration_s: f64) {
    counter!(REQUESTS_TOTAL, "status" => status).increment(1);
    histogram!(REQUEST_DURATION_SECONDS).record(duration_s);
    if drafted > 0 {
        histogram!(REQUEST_ACCEPTANCE_RATE).record(accepted as f64 / drafted as f64);
    }
}

pub fn record_step(round_s: f64, verify_s: f64, draft_s: Option<f64>) {
    histogram!(ROUND_SECONDS).record(round_s);
    histogram!(VERIFY_STEP_SECONDS).record(verify_s);
    if let Some(d) = draft_s {
        histogram!(DRAFT_STEP_SECONDS).record(d);
    }
}

/// The watchdog found work waiting with no round for longer than the stall timeout.
pub fn record_engine_stall() {
    counter!(ENGINE_STALLS).increment(1);
}

/// 1 while the engine is stalled or stopped (what `/health` reports as 503), else 0.
pub fn set_engine_stalled(stalled: bool) {
    gauge!(ENGINE_STALLED).set(f64::from(u8::from(stalled)));
}

/// Seconds since the engine last made progress while work waits (0 while idle).
pub fn set_round_age(seconds: f64) {
    gauge!(ENGINE_ROUND_AGE).set(seconds);
}

/// A request the HTTP API answered with an error status (`reason`: "overloaded", "invalid",
/// "unavailable", "error"), so a refused request that never reached the engine is counted too.
pub fn record_refused(reason: &'static str) {
    counter!(REQUESTS_REFUSED, "reason" => reason).increment(1);
}

/// Exports the engine's health series from the start (see [`register_draft_gate`]).
pub fn register_engine_health() {
    counter!(ENGINE_STALLS).increment(0);
    gauge!(ENGINE_ROUND_AGE).set(0.0);
    gauge!(ENGINE_STALLED).set(0.0);
}

pub fn set_queue(running: usize, waiting: usize) {
    gauge!(REQUESTS_RUNNING).set(running as f64);
    gauge!(REQUESTS_WAITING).set(waiting as f64);
}

pub fn set_speculation(lenience: f32, gamma: usize) {
    gauge!(SPEC_LENIENCE).set(crate::sampling::widen(lenience));
    gauge!(SPEC_GAMMA).set(gamma as f64);
}

/// Tokens a request emitted in one round, `since_last` after its previous ones (`None`: these
/// are its first, `since_arrival` after it arrived).
pub fn record_tokens(count: usize, since_last: Option<f64>, since_arrival: f64) {
    if count == 0 {
        return;
    }
    counter!(GENERATION_TOKENS_TOTAL).increment(count as u64);
    let per_token = match since_last {
        Some(gap) => Some(gap / count as f64),
        None => {
            histogram!(TTFT_SECONDS).record(since_arrival);
            // The round's other tokens arrived with the first one.
            (count > 1).then_some(0.0)
        }
    };
    if let Some(t) = per_token {
        let n = if since_last.is_some() {
            count
        } else {
            count - 1
        };
        for _ in 0..n {
            histogram!(INTER_TOKEN_SECONDS).record(t);
        }
    }
}

pub fn record_admitted(prompt_tokens: usize) {
    counter!(PROMPT_TOKENS_TOTAL).increment(prompt_tokens as u64);
}

pub fn record_prefill(seconds: f64) {
    histogram!(PREFILL_SECONDS).record(seconds);
}

pub fn set_speedup_estimate(ratio: f64) {
    gauge!(SPEC_SPEEDUP_ESTIMATE).set(ratio);
}

/// A next round drafted during a verification within a request: `used` if the guess held.
pub fn record_draft_ahead(used: bool) {
    let outcome = if used { "used" } else { "discarded" };
    counter!(SPEC_DRAFT_AHEAD, "outcome" => outcome).increment(1);
}

pub fn set_overlap(ratio: f64) {
    gauge!(PIPELINE_OVERLAP).set(ratio);
}

pub fn set_kv_usage(model: &'static str, ratio: f64) {
    gauge!(KV_CACHE_USAGE, "model" => model).set(ratio);
}

/// A new sequence looked for a cached prefix and found `hit_tokens` of its prompt (0: a miss).
pub fn record_prefix_lookup(model: &'static str, hit_tokens: usize) {
    counter!(PREFIX_LOOKUPS, "model" => model).increment(1);
    if hit_tokens > 0 {
        counter!(PREFIX_HITS, "model" => model).increment(1);
        counter!(PREFIX_HIT_TOKENS, "model" => model).increment(hit_tokens as u64);
    }
}

pub fn record_prefix_eviction(model: &'static str) {
    counter!(PREFIX_EVICTIONS, "model" => model).increment(1);
}

pub fn set_prefix_cache(model: &'static str, slots: usize, tokens: usize) {
    gauge!(PREFIX_RETAINED_SLOTS, "model" => model).set(slots as f64);
    gauge!(PREFIX_RETAINED_TOKENS, "model" => model).set(tokens as f64);
}

/// Exports a model's prefix-cache counters and gauges at zero, so its dashboard panels show
/// zeros rather than "no data" before the first hit or eviction.
pub fn register_prefix_cache(model: &'static str) {
    for name in [
        PREFIX_LOOKUPS,
        PREFIX_HITS,
        PREFIX_HIT_TOKENS,
        PREFIX_EVICTIONS,
    ] {
        counter!(name, "model" => model).increment(0);
    }
    set_prefix_cache(model, 0, 0);
}

/// A reload of the config file's speculation settings: applied, or refused (nothing changed).
pub fn record_config_reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    counter!(CONFIG_RELOADS, "result" => result).increment(1);
}

/// Exports the reload counter at zero for both results.
pub fn register_config_reloads() {
    for result in ["ok", "error"] {
        counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
}
