//! A node's state and its request dispatch.
//!
//! [`Shared`] is what every core reads (configuration, Passport keys, the stop and serving
//! flags) and is immutable once serving starts but for those flags and a few atomic counters
//! (per-core counters, the per-worker inflight counts). [`Core`] is what one core owns alone:
//! its store (Redis connection and keys) and upstream state. `Core` is also the [`Handler`] that decides
//! which module answers a path, and turns a transient Redis failure into the contract's 503.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use tracing::debug;

use crate::config::Config;
use crate::error::{Error, Origin};
use crate::http::{Handler, Limits, Request, Response, remove_dot_segments};
use crate::metrics::CoreCounters;
use crate::operator;
use crate::passport::Passport;
use crate::placement;
use crate::proxy::{self, InflightCounters, Proxy};
use crate::redis::{Redis, RedisOptions};
use crate::registry;
use crate::store::{Keys, Store};

pub struct Shared {
    pub config: Config,
    pub passport: Passport,
    /// One set of counters per core, each written only by its core.
    pub counters: Vec<CoreCounters>,
    /// Set by the first stop signal: cores stop accepting and `/readyz` turns 503.
    pub stopping: AtomicBool,
    /// Whether this node is the serving fleet (see [`crate::fleet`]); false until the first
    /// claim of the fleet license succeeds.
    pub serving: AtomicBool,
    pub started: Instant,
    /// Forwards in flight per worker, counted across the cores.
    pub inflight: Arc<InflightCounters>,
    /// The cold-start window `/registry/health` last read from Redis, reported while Redis
    /// cannot be asked.
    pub last_quarantine_ms: AtomicU64,
}

impl Shared {
    pub fn new(config: Config, passport: Passport) -> Shared {
        Shared {
            counters: (0..config.cores())
                .map(|_| CoreCounters::default())
                .collect(),
            config,
            passport,
            stopping: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            started: Instant::now(),
            inflight: Arc::default(),
            last_quarantine_ms: AtomicU64::new(0),
        }
    }

    pub fn http_limits(&self) -> Limits {
        let http = &self.config.http;
        Limits {
            header_timeout: Duration::from_millis(http.header_timeout_ms),
            idle_timeout: Duration::from_millis(http.idle_timeout_ms),
            max_header_bytes: http.max_header_bytes,
            write_timeout: Duration::from_millis(http.write_timeout_ms),
        }
    }

    /// Client connections open on the whole node.
    pub fn connections(&self) -> u64 {
        self.counters.iter().map(|c| c.connections()).sum()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

pub struct Core {
    pub shared: Arc<Shared>,
    /// This core's position among the node's cores.
    pub index: usize,
    pub store: Store,
    pub proxy: Proxy,
    pub resolve_constants: placement::Constants,
}

impl Core {
    /// Must run inside the core's event loop: the Redis connection is driven by it.
    pub fn new(shared: Arc<Shared>, index: usize) -> Core {
        let config = &shared.config;
        let redis = Redis::connect(
            &config.redis_url,
            RedisOptions {
                request_timeout: Duration::from_millis(config.redis_timeout_ms),
                ..RedisOptions::default()
            },
        );
        let store = Store::new(
            redis,
            Keys::new(config.prefix.clone(), config.shards),
            config.lease_ttl_ms,
        );
        let proxy = Proxy::new(config.forwards.max_inflight, shared.inflight.clone());
        Core {
            resolve_constants: placement::Constants::new(config),
            shared,
            index,
            store,
            proxy,
        }
    }

    pub fn counters(&self) -> &CoreCounters {
        &self.shared.counters[self.index]
    }
}

impl Handler for Core {
    async fn handle(&self, req: &mut Request<'_>) -> Result<Response, Error> {
        match self.dispatch(req).await {
            // Contract §8: a Redis call that failed for a transient reason (disconnected, timed
            // out, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN) is the client's to retry.
            Err(e) if e.origin() == Origin::Redis && e.is_retryable() => {
                debug!(path = req.path(), error = %e, "registry unavailable");
                self.counters().count("unavailable");
                Ok(placement::unavailable(
                    "registry unavailable, retry",
                    Duration::ZERO,
                ))
            }
            other => other,
        }
    }
}

impl Core {
    /// Which module answers a path.
    async fn dispatch(&self, req: &mut Request<'_>) -> Result<Response, Error> {
        let readable = matches!(*req.method(), Method::GET | Method::HEAD);
        match req.path() {
            "/healthz" if readable => return Ok(operator::healthz()),
            "/readyz" if readable => return Ok(operator::readyz(self).await),
            "/metrics" if readable => return Ok(operator::metrics(self, req)),
            _ => {}
        }
        let base = self.shared.config.base_path.as_str();
        // The URI shares its bytes (a reference count, no copy): the path below the base can
        // be borrowed from it while the request itself is handed on mutably. Dot segments are
        // removed here, once, before any route or instance is read off the path.
        let uri = req.head.uri.clone();
        let clean = remove_dot_segments(uri.path());
        let Some(path) = strip_base(&clean, base) else {
            return Ok(Response::error(StatusCode::NOT_FOUND, "not found"));
        };
        if path == "/registry" || path.starts_with("/registry/") {
            return registry::handle(self, req, path).await;
        }
        // The data plane: `/{ns}/{id}{rest}`. A path that names no namespace is a route miss.
        if path.len() > 1 && path.starts_with('/') {
            // What the worker is sent: the clean path and the query as it came.
            let with_query: Cow<'_, str> = match (&clean, uri.query()) {
                (Cow::Borrowed(_), _) => {
                    Cow::Borrowed(uri.path_and_query().map_or(path, |pq| pq.as_str()))
                }
                (Cow::Owned(p), Some(q)) => Cow::Owned(format!("{p}?{q}")),
                (Cow::Owned(p), None) => Cow::Borrowed(p.as_str()),
            };
            return proxy::handle(self, req, path, &with_query[base.len()..]).await;
        }
        Ok(Response::error(StatusCode::NOT_FOUND, "not found"))
    }
}

/// The path below `base` (`""` serves everything), or `None` outside it: `/apix` is not
/// under `/api`.
fn strip_base<'p>(path: &'p str, base: &str) -> Option<&'p str> {
    path.strip_prefix(base)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::strip_base;

    #[test]
    fn base_path_matches_whole_segments() {
        assert_eq!(strip_base("/a/b", ""), Some("/a/b"));
        assert_eq!(strip_base("/api/registry/x", "/api"), Some("/registry/x"));
        assert_eq!(strip_base("/api", "/api"), Some(""));
        assert_eq!(strip_base("/apix/registry", "/api"), None);
        assert_eq!(strip_base("/other", "/api"), None);
    }
}
