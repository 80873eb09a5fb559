//! `GET /metrics`: this node's counters as Prometheus text (OpenMetrics when the scraper's
//! `Accept` asks for it), for operators whose credential sees
//! the whole fleet (every namespace, unrestricted hostnames and envs), and, the same answer
//! without a credential, on the metrics listener (`metrics_listen`).

use std::sync::atomic::Ordering;

use http::{HeaderValue, StatusCode, header};
use tracing::error;

use crate::answers;
use crate::http::{Request, Response};
use crate::metrics::{self, Format, Snapshot};
use crate::node::Core;
use crate::passport::Credential;
use crate::store::scripts;

// Every script of the store has its series.
const _: () = assert!(scripts::NAMES.len() <= metrics::MAX_SCRIPTS);

/// For a credential the route table authorized as an operator's.
pub async fn metrics(core: &Core, req: &Request<'_>, credential: &Credential) -> Response {
    let whole_fleet = credential.route_claim().is_ok_and(|claim| {
        claim.all_namespaces() && claim.unrestricted_hostnames() && claim.unrestricted_envs()
    });
    if !whole_fleet {
        return answers::forbidden();
    }
    scrape(core, req).await
}

/// The metrics, whoever asks: [`metrics`] once the credential passed, and the metrics
/// listener, which asks for none.
pub async fn scrape(core: &Core, req: &Request<'_>) -> Response {
    let shared = &core.shared;
    let hostname_aware = shared.config.hostname_aware;
    let fleet = match shared.mirror.view(&core.store, hostname_aware).await {
        Ok(fleet) => fleet,
        Err(e) => {
            error!(error = %e, "reading the fleet for metrics");
            return answers::metrics_failed();
        }
    };
    let snapshot = Snapshot {
        fleet,
        hostname_aware,
        outcomes: metrics::outcomes(&shared.counters).collect(),
        connections: shared.connections(),
        connections_refused: metrics::connections_refused(&shared.counters),
        uptime_secs: shared.started.elapsed().as_secs_f64(),
        serving: shared.is_serving(),
        redis_connected: shared.cores_reaching_redis(),
        placements: metrics::new_placements(&shared.counters),
        strict_wait_failures: metrics::strict_wait_failures(&shared.counters),
        sweeps: shared.sweeps.passes.load(Ordering::Relaxed),
        swept: vec![
            ("placement", shared.sweeps.rows.load(Ordering::Relaxed)),
            ("overwritten", shared.sweeps.markers.load(Ordering::Relaxed)),
        ],
        requests: metrics::requests(&shared.counters),
        protocols: metrics::protocols(&shared.counters).collect(),
        request_durations: metrics::request_durations(&shared.counters),
        upstream_durations: metrics::upstream_durations(&shared.counters),
        script_durations: metrics::script_durations(&shared.counters, &scripts::NAMES),
        upstream_errors: metrics::upstream_errors(&shared.counters),
        pool_dropped: metrics::pool_dropped(&shared.counters),
        workers: shared.workers.by_worker(),
        wakes: vec![
            ("woken", shared.sweeps.woken.load(Ordering::Relaxed)),
            (
                "pending",
                shared.sweeps.wakes_pending.load(Ordering::Relaxed),
            ),
        ],
    };
    let format = Format::from_accept(req.header(header::ACCEPT).map(|v| v.as_bytes()));
    match metrics::render(snapshot, format) {
        Ok(text) => Response::new(StatusCode::OK, None, text.into()).header(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        ),
        Err(e) => {
            error!(error = %e, "rendering metrics");
            answers::metrics_failed()
        }
    }
}
