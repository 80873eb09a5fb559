//! A node's state, below the routes ([`crate::routes`]).
//!
//! [`Shared`] is what every core reads (configuration, Passport keys, the stop and serving
//! flags) and is immutable once serving starts but for those flags and a few atomic counters
//! (per-core counters, the per-worker gauges). [`Core`] is what one core owns alone:
//! its store (Redis connection and keys) and upstream state.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::access_log::{AccessLog, AccessLogSetup};
use crate::config::{AccessLogFormat, Config};
use crate::fleet::{Standing, StandingFlag};
use crate::http::Limits;
use crate::http::tls::{Alpn, ClientTls, PemFile, ServerTls, TlsSetupError};
use crate::limits::{connections::ConnectionTable, placements::PlacementRate};
use crate::metrics::{CoreCounters, SweepCounters};
use crate::passport::Passport;
use crate::placement;
use crate::redis::{Redis, RedisOptions};
use crate::store::{Keys, Store};
use crate::upstream::{Upstreams, WorkerGauges};

pub struct Shared {
    pub config: Config,
    pub passport: Passport,
    /// One set of counters per core, each written only by its core.
    pub counters: Vec<CoreCounters>,
    /// Set by the first stop signal: cores stop accepting and `/readyz` turns 503.
    pub stopping: AtomicBool,
    /// Whether this node is the serving fleet, and if not why (see [`crate::fleet`]); not
    /// serving until the first claim of the fleet license succeeds.
    pub standing: StandingFlag,
    pub started: Instant,
    /// Forwards in flight and idle pooled connections per worker, across the cores.
    pub workers: Arc<WorkerGauges>,
    /// The cold-start window `/registry/health` last read from Redis, reported while Redis
    /// cannot be asked.
    pub last_quarantine_ms: AtomicU64,
    /// What the sweeper did, while this node held its lease.
    pub sweeps: SweepCounters,
    /// The registry as the mirror poll last read it, for `/metrics`.
    pub mirror: crate::mirror::Mirror,
    /// The heartbeat refusals already logged ([`crate::registry::HeartbeatRefusal`]).
    pub heartbeat_refusals: crate::registry::SaidOnce,
    pub tls: NodeTls,
    /// The access log's format and target, when it is on.
    pub access_log: Option<Arc<AccessLogSetup>>,
    /// Connections per client address, when `limits.max_connections_per_ip` is on.
    pub client_connections: Option<Arc<ConnectionTable>>,
}

/// The node's TLS: its listener's certificate pair when it serves HTTPS, the trust its
/// connections to `https` workers are verified with, and the trust its connections to a
/// `rediss` Redis are (every core's client gets a clone of this one).
pub struct NodeTls {
    pub listener: Option<ServerTls>,
    pub workers: ClientTls,
    /// Set when `redis_url` is `rediss://` or `rediss-cluster://`.
    pub redis: Option<ClientTls>,
}

impl NodeTls {
    /// Reads every PEM file the configuration names; the error is one line naming the key.
    pub fn load(config: &Config) -> Result<NodeTls, String> {
        let named = |key: &str| {
            let key = key.to_owned();
            move |e: TlsSetupError| format!("config error: {key}: {e}")
        };
        let listener = match (&config.tls.cert_file, &config.tls.key_file) {
            (Some(cert), Some(key)) => Some(ServerTls::load(cert, key).map_err(|e| {
                let key = match e.file {
                    PemFile::Key => "tls.key_file",
                    _ => "tls.cert_file",
                };
                named(key)(e)
            })?),
            _ => None,
        };
        let workers = ClientTls::new(config.forwards.ca_file.as_deref(), Alpn::Http1)
            .map_err(named("forwards.ca_file"))?;
        let redis = if config.redis_url.tls() {
            Some(
                ClientTls::new(config.redis_ca_file.as_deref(), Alpn::None)
                    .map_err(named("redis_ca_file"))?,
            )
        } else {
            if config.redis_ca_file.is_some() {
                tracing::warn!("redis_ca_file is set but redis_url is not rediss://: it is unused");
            }
            None
        };
        Ok(NodeTls {
            listener,
            workers,
            redis,
        })
    }
}

impl Shared {
    pub fn new(config: Config, passport: Passport, tls: NodeTls) -> Shared {
        let client_connections = ConnectionTable::new(config.limits.max_connections_per_ip);
        Shared {
            tls,
            counters: (0..config.cores())
                .map(|_| CoreCounters::default())
                .collect(),
            config,
            passport,
            stopping: AtomicBool::new(false),
            standing: StandingFlag::default(),
            started: Instant::now(),
            workers: Arc::default(),
            last_quarantine_ms: AtomicU64::new(0),
            sweeps: SweepCounters::default(),
            mirror: crate::mirror::Mirror::default(),
            access_log: None,
            client_connections,
            heartbeat_refusals: crate::registry::SaidOnce::default(),
        }
    }

    /// Turns the access log on as the configuration says (`access_log`, `access_log_path`);
    /// the error is one line naming the key whose target cannot be opened.
    pub fn open_access_log(&mut self) -> Result<(), String> {
        let config = &self.config;
        if config.access_log == AccessLogFormat::Off {
            return Ok(());
        }
        let path = config.access_log_path.as_deref();
        let setup = AccessLogSetup::new(config.access_log, path).map_err(|e| match path {
            Some(p) => format!(
                "config error: access_log_path: cannot open {}: {e}",
                p.display()
            ),
            None => format!("config error: access_log: cannot write to standard output: {e}"),
        })?;
        self.access_log = Some(Arc::new(setup));
        Ok(())
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

    /// How every Redis client of the node connects: each core's, and the startup check's.
    pub fn redis_options(&self) -> RedisOptions {
        RedisOptions {
            request_timeout: Duration::from_millis(self.config.redis_timeout_ms),
            tls: self.tls.redis.clone(),
            ..RedisOptions::default()
        }
    }

    /// Client connections open on the whole node.
    pub fn connections(&self) -> u64 {
        self.counters.iter().map(|c| c.connections()).sum()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    pub fn standing(&self) -> Standing {
        self.standing.get()
    }

    pub fn is_serving(&self) -> bool {
        self.standing() == Standing::Serving
    }
}

pub struct Core {
    pub shared: Arc<Shared>,
    /// This core's position among the node's cores.
    pub index: usize,
    pub store: Store,
    pub upstreams: Upstreams,
    pub resolve_constants: placement::Constants,
    /// This core's share of `limits.new_placements_per_ip_per_s`, when it is on.
    pub placement_rate: Option<PlacementRate>,
    /// This core's access log, when it is on.
    pub access_log: Option<AccessLog>,
}

impl Core {
    /// Must run inside the core's event loop: the Redis connection is driven by it.
    pub fn new(shared: Arc<Shared>, index: usize) -> Core {
        let config = &shared.config;
        let timed = shared.clone();
        let redis = Redis::connect(&config.redis_url, shared.redis_options())
            .observed(move |script, took| timed.counters[index].script_took(script, took));
        let store = Store::new(
            redis,
            Keys::new(config.prefix.clone(), config.shards),
            config.lease_ttl_ms,
        );
        let upstreams = Upstreams::new(
            config.forwards.max_inflight,
            Duration::from_millis(config.forwards.upstream_idle_timeout_ms),
            shared.workers.clone(),
        );
        let node_id: Arc<str> = config.node_id.as_str().into();
        let access_log = (shared.access_log.clone()).map(|setup| AccessLog::new(setup, node_id));
        Core {
            access_log,
            resolve_constants: placement::Constants::new(config),
            placement_rate: PlacementRate::new(
                config.limits.new_placements_per_ip_per_s,
                config.cores(),
            ),
            shared,
            index,
            store,
            upstreams,
        }
    }

    pub fn counters(&self) -> &CoreCounters {
        &self.shared.counters[self.index]
    }
}
