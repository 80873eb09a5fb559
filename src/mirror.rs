//! The mirror poll (contract §6): every node, every third of a lease, prunes what the spec
//! calls pruned (worker records dead for more than a lease, with their bucket copies and
//! namespace-list entries, and the bindings no live worker uses: `Store::prune`) and reads the
//! registry into a node-local [`FleetView`], the fleet gauges of `GET /metrics`. No resolve
//! reads it. `/metrics` takes the view while it is at most [`MEMO`] old and reads a fresh one
//! itself otherwise (Redis away: `500 metrics collection failed`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tracing::{info, warn};

use crate::clock::now_ms;
use crate::config::Config;
use crate::error::Error;
use crate::fleet::StandingFlag;
use crate::http::Shutdown;
use crate::metrics::FleetView;
use crate::store::Store;

/// How long `/metrics` serves one view.
pub const MEMO: Duration = Duration::from_secs(5);

/// The last view and when it was read, shared by the node's cores (read per scrape, written
/// per poll: never on the request path).
#[derive(Default)]
pub struct Mirror {
    last: Mutex<Option<(Instant, Arc<FleetView>)>>,
}

impl Mirror {
    fn set(&self, view: FleetView) -> Arc<FleetView> {
        let view = Arc::new(view);
        *self.last.lock().expect("mirror lock") = Some((Instant::now(), view.clone()));
        view
    }

    /// The view for a scrape: the last one while at most [`MEMO`] old, else a fresh read.
    pub async fn view(&self, store: &Store, hostname_aware: bool) -> Result<Arc<FleetView>, Error> {
        let last = self.last.lock().expect("mirror lock").clone();
        if let Some((at, view)) = last
            && at.elapsed() <= MEMO
        {
            return Ok(view);
        }
        Ok(self.set(FleetView::read(store, hostname_aware).await?))
    }
}

impl FleetView {
    /// One read of the registry: the session records, the sweeper lease, and each known
    /// (env, ns)'s placement rows per bucket (`HLEN`, constant time each).
    pub async fn read(store: &Store, hostname_aware: bool) -> Result<FleetView, Error> {
        let now = now_ms();
        let sessions = store.sessions().await?;
        // Draining: the worker's own flag or an operator drain of its client (spec).
        let drains = store.drains(&sessions).await?;
        let mut view = FleetView {
            sweeper: store.sweeper_holder().await?,
            ..FleetView::default()
        };
        for s in &sessions {
            for ns in &s.namespaces {
                let env = s.env_of(ns).to_owned();
                view.placements
                    .entry((ns.clone(), env.clone()))
                    .or_default();
                if s.expiry <= now {
                    continue;
                }
                let (hostname, env) = if hostname_aware {
                    (s.hostname.clone().unwrap_or_default(), env)
                } else {
                    (String::new(), String::new())
                };
                let counts = view.workers.entry((ns.clone(), hostname, env)).or_default();
                counts.live += 1;
                counts.draining += u64::from(s.draining || drains.contains_key(&s.client_id));
                counts.degraded += u64::from(s.degraded_since.is_some());
            }
        }
        let counts = view.placements.keys().map(|(ns, env)| async move {
            let mut rows = 0;
            for bucket in 0..store.keys.shards() {
                rows += store.placement_rows(bucket, env, ns).await?;
            }
            Ok::<_, Error>(rows)
        });
        let counted: Vec<u64> = join_all(counts)
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        for (rows, n) in view.placements.values_mut().zip(counted) {
            *rows = n;
        }
        Ok(view)
    }
}

/// Prunes and reads the view every third of a lease until the core shuts down, while the node
/// is the serving fleet: a node that is not may disagree with the fleet on what a bucket is
/// (and, at start, its Redis connection is still being made: a poll then could only fail).
/// Run by one core per node.
pub async fn keep_polling(
    store: &Store,
    config: &Config,
    standing: &StandingFlag,
    mirror: &Mirror,
    shutdown: Shutdown,
) {
    let every = Duration::from_millis((config.lease_ttl_ms / 3).max(100));
    let mut failing = false;
    while !shutdown.is_fired() {
        // Not serving: looked at again soon, to poll soon after the first claim.
        let wait = if standing.is_serving() {
            failing = poll(store, config.hostname_aware, mirror, failing).await;
            every
        } else {
            every.min(Duration::from_millis(100))
        };
        monoio::select! {
            _ = monoio::time::sleep(wait) => {}
            _ = shutdown.fired() => {}
        }
    }
}

/// One poll: prune, then read the view. Whether it failed; a failure is said once until a
/// poll succeeds again (`failing`: the last one failed).
async fn poll(store: &Store, hostname_aware: bool, mirror: &Mirror, failing: bool) -> bool {
    let polled = async {
        let pruned = store.prune().await?;
        let view = FleetView::read(store, hostname_aware).await?;
        Ok::<_, Error>((pruned, view))
    };
    match polled.await {
        Ok((pruned, view)) => {
            if pruned > 0 {
                info!(records = pruned, "mirror poll pruned dead worker records");
            }
            mirror.set(view);
            false
        }
        Err(e) => {
            if !failing {
                warn!(error = %e, "mirror poll failed; retrying every third of a lease");
            }
            true
        }
    }
}
