//! `GET /healthz` (the process answers), `GET /readyz` (this node should get traffic) and
//! `GET /registry/health` (what this node has been doing).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::StatusCode;
use tracing::debug;

use crate::answers::Handled;
use crate::error::Error;
use crate::fleet;
use crate::http::Response;
use crate::metrics;
use crate::node::Core;
use crate::store::scripts::READY;

pub fn healthz() -> Response {
    Response::json(StatusCode::OK, Bytes::from_static(b"{\"ok\":true}"))
}

/// 200 with an empty body while the node is not stopping, is the serving fleet, the answering
/// core's Redis runs scripts and every other core had a Redis connection when it last looked
/// ([`Core::watch_redis`]); 503 otherwise. Whichever core a probe reaches, it says the same
/// of the node: one core still reconnecting would answer its share of requests 503.
pub async fn readyz(core: &Core) -> Response {
    let shared = &core.shared;
    if shared.is_stopping() || !shared.is_serving() || !shared.other_cores_reach_redis(core.index) {
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
    let protocols: serde_json::Map<String, serde_json::Value> =
        metrics::protocols(&shared.counters)
            .map(|(name, n)| (name.to_owned(), n.into()))
            .collect();
    // Spec: it answers while booting or draining; with Redis away, from what the node saw
    // (and without what only Redis can say now: the windows per bucket, the license).
    let (quarantine_ms, quarantine, license) = match what_redis_says(core).await {
        Ok((windows, license)) => {
            let longest = windows.values().copied().max().unwrap_or(0);
            shared.last_quarantine_ms.store(longest, Ordering::Relaxed);
            let windows: serde_json::Map<String, serde_json::Value> = windows
                .into_iter()
                .map(|(bucket, ms)| (bucket.to_string(), ms.into()))
                .collect();
            (longest, windows.into(), license)
        }
        Err(e) => {
            debug!(error = %e, "health: redis unavailable, reporting the last window seen");
            let last = shared.last_quarantine_ms.load(Ordering::Relaxed);
            (last, serde_json::Value::Null, serde_json::Value::Null)
        }
    };
    let mut body = serde_json::json!({
        "resolutions": resolutions,
        "connections": connections,
        "protocols": protocols,
        "quarantineMs": quarantine_ms,
        "quarantine": quarantine,
        "uptimeMs": shared.started.elapsed().as_millis() as u64,
        "serving": shared.is_serving(),
        "license": license,
    });
    if let Some(rss) = rss_bytes() {
        body["rssBytes"] = rss.into();
    }
    Ok(Response::json_value(StatusCode::OK, &body))
}

/// The remaining cold-start window of each bucket still in one (ms, rounded up, by Redis's
/// clock), and the fleet license in force: `{held, epoch}`, `held` when it is this node's
/// (byte for byte, as `fleet.lua` compares), `epoch` its epoch; both `null` when none is.
async fn what_redis_says(core: &Core) -> Result<(BTreeMap<u32, u64>, serde_json::Value), Error> {
    let now = core
        .store
        .redis
        .evalsha(&READY, &[], &[])
        .await?
        .as_int()
        .unwrap_or_default();
    let lease = core.shared.config.lease_ttl_ms as i64;
    let windows = (0..)
        .zip(core.store.boot_times().await?)
        .filter_map(|(bucket, boot)| {
            let left = boot? + lease - now;
            (left > 0).then_some((bucket, left as u64))
        })
        .collect();
    let license = match core.store.fleet_license().await? {
        Some(stored) => {
            let epoch = serde_json::from_str::<serde_json::Value>(&stored)
                .ok()
                .and_then(|l| l.get("epoch").cloned())
                .unwrap_or_default();
            let held = stored == fleet::license(&core.shared.config);
            serde_json::json!({ "held": held, "epoch": epoch })
        }
        None => serde_json::json!({ "held": false, "epoch": null }),
    };
    Ok((windows, license))
}

/// Resident set size from /proc (absent where there is no /proc).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
