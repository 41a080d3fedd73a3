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
/// sequences' reservations; retained prefixes give way to any new sequence, so they are not
/// pressure), its prefix cache's hit rate by tokens, and its throughput.
pub(super) fn load_report(f: &LoadFigures, unix_seconds: u64) -> Value {
    let (s, c) = (&f.scheduler, &f.cache);
    let used = c.reserved_tokens.saturating_sub(c.retained_tokens);
    let usage = used as f64 / c.capacity_tokens.max(1) as f64;
    let hit_rate = c.prefix_hit_tokens as f64 / c.prefix_queried_tokens.max(1) as f64;
    let total = s.active + s.queued;
    json!({
        "timestamp": rfc3339_utc(unix_seconds),
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

/// `unix_seconds` as an RFC 3339 time in UTC (`2026-11-28T22:50:45Z`).
fn rfc3339_utc(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let secs = unix_seconds % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_rfc_3339_in_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_795_906_245), "2026-11-28T22:50:45Z");
    }

    #[test]
    fn the_report_has_the_fields_smg_parses_with_integers_as_integers() {
        let f = LoadFigures {
            scheduler: SchedulerStats {
                active: 3,
                queued: 2,
                queued_prompt_tokens: 700,
                ..Default::default()
            },
            cache: CacheStats {
                capacity_tokens: 1000,
                reserved_tokens: 600,
                retained_tokens: 100,
                prefix_queried_tokens: 400,
                prefix_hit_tokens: 100,
                ..Default::default()
            },
            max_running: 8,
            throughput: 42.5,
        };
        let r = load_report(&f, 0);
        let rank = &r["loads"][0];
        for key in [
            "dp_rank",
            "num_running_reqs",
            "num_waiting_reqs",
            "num_waiting_uncached_tokens",
            "num_total_reqs",
            "num_used_tokens",
            "max_total_num_tokens",
            "max_running_requests",
        ] {
            assert!(rank[key].is_u64(), "{key}: {}", rank[key]);
        }
        assert_eq!(rank["num_total_reqs"], 5);
        assert_eq!(rank["num_used_tokens"], 500);
        assert_eq!(rank["token_usage"], 0.5);
        assert_eq!(rank["cache_hit_rate"], 0.25);
        assert_eq!(rank["gen_throughput"], 42.5);
        assert_eq!(r["dp_rank_count"], 1);
    }
}
