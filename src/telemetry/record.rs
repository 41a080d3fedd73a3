//! The calls that record a metric, and the ones that export a series at zero before its first
//! sample.
//!
//! Why it exists: the engine and server record through these named calls rather than through
//! metric names and labels, so every place that records a metric records it the same way.

use metrics::{counter, gauge, histogram};

use crate::sampling::ProposalEvidence;

use super::names::*;
use super::vllm_aliases::{record_vllm_prefix_lookup, set_vllm_kv_usage, set_vllm_queue};

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

/// A sampled round's measure of both proposals at its verified positions.
pub fn record_proposal_evidence(e: &ProposalEvidence) {
    for (proposal, positions, stand) in [
        ("drawn", e.sampled_rows, e.sampled),
        ("likeliest", e.rows, e.likeliest),
    ] {
        counter!(SPEC_SAMPLED_POSITIONS, "proposal" => proposal).increment(u64::from(positions));
        // Counters are integers: the probability in thousandths.
        counter!(SPEC_SAMPLED_STAND, "proposal" => proposal)
            .increment((stand * 1000.0).round() as u64);
    }
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

/// A sequence's forward gave NaN or infinite logits (the model's numbers are broken).
pub fn record_non_finite_forward() {
    counter!(NON_FINITE_FORWARDS).increment(1);
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
    counter!(NON_FINITE_FORWARDS).increment(0);
    gauge!(ENGINE_ROUND_AGE).set(0.0);
    gauge!(ENGINE_STALLED).set(0.0);
}

pub fn set_queue(running: usize, waiting: usize) {
    gauge!(REQUESTS_RUNNING).set(running as f64);
    gauge!(REQUESTS_WAITING).set(waiting as f64);
    set_vllm_queue(running, waiting);
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

/// What drafting saved lately against plain decoding, net, in seconds (the governor's ledger).
pub fn set_drafting_net(seconds: f64) {
    gauge!(SPEC_DRAFTING_NET).set(seconds);
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
    if model == "target" {
        set_vllm_kv_usage(ratio);
    }
}

/// A new sequence looked for a cached prefix of its `prompt_tokens` and found `hit_tokens` of
/// them (0: a miss).
pub fn record_prefix_lookup(model: &'static str, prompt_tokens: usize, hit_tokens: usize) {
    if model == "target" {
        record_vllm_prefix_lookup(prompt_tokens, hit_tokens);
    }
    counter!(PREFIX_LOOKUPS, "model" => model).increment(1);
    if hit_tokens > 0 {
        counter!(PREFIX_HITS, "model" => model).increment(1);
        counter!(PREFIX_HIT_TOKENS, "model" => model).increment(hit_tokens as u64);
    }
}

/// What a model's prefix cache holds now: its token runs, tokens, bytes and byte budget.
pub fn set_prefix_cache(
    model: &'static str,
    runs: usize,
    tokens: usize,
    bytes: usize,
    budget: usize,
) {
    gauge!(PREFIX_RUNS, "model" => model).set(runs as f64);
    gauge!(PREFIX_TOKENS, "model" => model).set(tokens as f64);
    gauge!(PREFIX_BYTES, "model" => model).set(bytes as f64);
    gauge!(PREFIX_BUDGET_BYTES, "model" => model).set(budget as f64);
}

/// Runs a model's prefix cache evicted for room.
pub fn record_prefix_evictions(model: &'static str, runs: u64) {
    counter!(PREFIX_EVICTIONS, "model" => model).increment(runs);
}

/// Exports a model's prefix-cache counters and gauges at zero, so its dashboard panels show
/// zeros rather than "no data" before the first hit or eviction.
pub fn register_prefix_cache(model: &'static str, budget_bytes: usize) {
    for name in [
        PREFIX_LOOKUPS,
        PREFIX_HITS,
        PREFIX_HIT_TOKENS,
        PREFIX_EVICTIONS,
    ] {
        counter!(name, "model" => model).increment(0);
    }
    set_prefix_cache(model, 0, 0, 0, budget_bytes);
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
