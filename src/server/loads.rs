//! What routers read to balance a fleet of tandem replicas: `GET /v1/loads` and `GET /loads`
//! (smg's load report), and `GET /get_load` (vllm-router's `power_of_two`).
//!
//! Why it exists: a router that cannot read a replica's load balances blind (smg registers an
//! engine it does not know as generic, and asks such an engine only these routes; vllm-router
//! reports load -1). The shapes are those the routers' sources parse: smg's
//! `WorkerLoadResponse` (every integer a JSON integer, `loads` never empty) and vllm-router's
//! `{"load": n}`. The same numbers are on `/metrics`, under tandem's names and vLLM's.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::engine::{CacheStats, SchedulerStats};
use crate::model::text::chat_template::strftime;

/// `GET /get_load`: the requests running and waiting, as one integer.
pub(super) async fn get_load(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    let s = loaded.engine.stats().await?;
    Ok(Json(json!({ "load": s.active + s.queued })))
}

/// `GET /v1/loads` and `GET /loads` (any query: `include`, `model`): the load report.
pub(super) async fn loads(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    let scheduler = loaded.engine.stats().await?;
    let cache = loaded.engine.cache_stats().await?;
    let figures = LoadFigures {
        scheduler,
        cache,
        max_running: loaded.engine.max_seqs(),
        throughput: state
            .throughput
            .rate(Instant::now(), scheduler.generated_tokens),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Json(load_report(&figures, now)))
}

/// What one load report tells.
pub(super) struct LoadFigures {
    pub scheduler: SchedulerStats,
    pub cache: CacheStats,
    pub max_running: usize,
    /// Tokens generated per second lately.
    pub throughput: f64,
}

/// smg's load report of one engine (one rank): its requests, its KV cache's use (running
/// sequences' reservations; the prefix cache has a budget of its own, so it is not pressure),
/// its prefix cache's hit rate by tokens, and its throughput.
pub(super) fn load_report(f: &LoadFigures, unix_seconds: u64) -> Value {
    let (s, c) = (&f.scheduler, &f.cache);
    let used = c.reserved_tokens;
    let usage = used as f64 / c.capacity_tokens.max(1) as f64;
    let hit_rate = c.prefix_hit_tokens as f64 / c.prefix_queried_tokens.max(1) as f64;
    let total = s.active + s.queued;
    json!({
        "timestamp": strftime("%Y-%m-%dT%H:%M:%SZ", unix_seconds),
        "version": concat!("tandem ", env!("CARGO_PKG_VERSION")),
        "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": s.active,
            "num_waiting_reqs": s.queued,
            "num_waiting_uncached_tokens": s.queued_prompt_tokens,
            "num_total_reqs": total,
            "num_used_tokens": used,
            "max_total_num_tokens": c.capacity_tokens,
            "token_usage": usage,
            "active_token_usage": usage,
            "gen_throughput": f.throughput,
            "cache_hit_rate": hit_rate,
            "max_running_requests": f.max_running,
        }],
        "aggregate": {
            "total_running_reqs": s.active,
            "total_waiting_reqs": s.queued,
            "total_reqs": total,
            "avg_token_usage": usage,
            "avg_throughput": f.throughput,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_counts_running_sequences_reservations_and_the_caches_hits_by_tokens() {
        let f = LoadFigures {
            scheduler: SchedulerStats {
                active: 3,
                queued: 2,
                queued_prompt_tokens: 700,
                ..Default::default()
            },
            cache: CacheStats {
                capacity_tokens: 1000,
                reserved_tokens: 500,
                prefix_tokens: 100,
                prefix_queried_tokens: 400,
                prefix_hit_tokens: 100,
                ..Default::default()
            },
            max_running: 8,
            throughput: 42.5,
        };
        let r = load_report(&f, 1_795_906_245);
        assert_eq!(r["timestamp"], "2026-11-28T22:50:45Z");
        let rank = &r["loads"][0];
        assert!(rank["num_waiting_uncached_tokens"].is_u64());
        assert_eq!(rank["num_waiting_uncached_tokens"], 700);
        assert_eq!(rank["num_total_reqs"], 5);
        assert_eq!(rank["num_used_tokens"], 500);
        assert_eq!(rank["token_usage"], 0.5);
        assert_eq!(rank["cache_hit_rate"], 0.25);
        assert_eq!(rank["gen_throughput"], 42.5);
        assert_eq!(r["dp_rank_count"], 1);
    }
}
