//! `GET /healthz` (the process answers), `GET /readyz` (this node should get traffic) and
//! `GET /registry/health` (what this node has been doing).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::StatusCode;
use tracing::debug;

use crate::answers::Handled;
use crate::error::Error;
use crate::http::Response;
use crate::metrics;
use crate::node::Core;
use crate::store::scripts::READY;

pub fn healthz() -> Response {
    Response::json(StatusCode::OK, Bytes::from_static(b"{\"ok\":true}"))
}

/// 200 with an empty body while the node is not stopping, is the serving fleet, and its core's
/// Redis runs scripts; 503 otherwise. Asked per core, so a core whose connection is down
/// reports itself.
pub async fn readyz(core: &Core) -> Response {
    if core.shared.is_stopping() || !core.shared.is_serving() {
        return Response::empty(StatusCode::SERVICE_UNAVAILABLE);
    }
    match core.store.redis.evalsha(&READY, &[], &[]).await {
        Ok(_) => Response::empty(StatusCode::OK),
        Err(e) => {
            debug!(error = %e, "not ready: redis");
            Response::empty(StatusCode::SERVICE_UNAVAILABLE)
        }
    }
}

/// `GET /registry/health`: this node's view of itself. Answers while booting or draining.
pub async fn registry_health(core: &Core) -> Handled {
    let shared = &core.shared;
    let resolutions: serde_json::Map<String, serde_json::Value> =
        metrics::outcomes(&shared.counters)
            .map(|(name, n)| (name.to_owned(), n.into()))
            .collect();
    let connections = shared.connections();
    // Spec: it answers while booting or draining; with Redis away, from what the node saw.
    let quarantine = match quarantine_ms(core).await {
        Ok(ms) => {
            shared.last_quarantine_ms.store(ms, Ordering::Relaxed);
            ms
        }
        Err(e) => {
            debug!(error = %e, "health: redis unavailable, reporting the last window seen");
            shared.last_quarantine_ms.load(Ordering::Relaxed)
        }
    };
    let mut body = serde_json::json!({
        "resolutions": resolutions,
        "connections": connections,
        "quarantineMs": quarantine,
        "uptimeMs": shared.started.elapsed().as_millis() as u64,
    });
    if let Some(rss) = rss_bytes() {
        body["rssBytes"] = rss.into();
    }
    Ok(Response::json_value(StatusCode::OK, &body))
}

/// The largest remaining cold-start window across the buckets, by Redis's clock.
async fn quarantine_ms(core: &Core) -> Result<u64, Error> {
    let now = core
        .store
        .redis
        .evalsha(&READY, &[], &[])
        .await?
        .as_int()
        .unwrap_or_default();
    let lease = core.shared.config.lease_ttl_ms as i64;
    let longest = core
        .store
        .boot_times()
        .await?
        .into_iter()
        .map(|boot| boot + lease - now)
        .max()
        .unwrap_or(0);
    Ok(longest.max(0) as u64)
}

/// Resident set size from /proc (absent where there is no /proc).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
