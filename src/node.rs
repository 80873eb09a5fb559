//! A node's state, below the routes ([`crate::routes`]).
//!
//! [`Shared`] is what every core reads (the configuration the node started with, the current
//! [`Settings`], the stop and serving flags) and is immutable once serving starts but for those
//! flags, the settings a reload replaces and a few atomic counters (per-core counters, the
//! per-worker gauges). [`Core`] is what one core owns alone: its store (Redis connection and
//! keys), upstream state, and its view of the current settings ([`Live`]).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::access_log::AccessLog;
use crate::config::Config;
use crate::fleet::{Standing, StandingFlag};
use crate::http::tls::{Alpn, ClientTls, PemFile, ServerTls, TlsSetupError};
use crate::limits::{connections::ConnectionTable, placements::PlacementRate};
use crate::metrics::{CoreCounters, SweepCounters};
use crate::redis::{Redis, RedisOptions};
use crate::settings::{LiveSettings, Settings};
use crate::store::{Keys, Store};
use crate::upstream::{Upstreams, WorkerGauges};

pub struct Shared {
    /// The configuration the node started with: read the keys of
    /// [`crate::config::RESTART_ONLY`] here, every other one through [`Core::live`] (or
    /// [`Shared::settings`] off the cores), which a reload replaces.
    pub config: Config,
    pub settings: LiveSettings,
    /// The configuration file, read again by a reload.
    pub config_file: Option<std::path::PathBuf>,
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
    pub heartbeat_refusals: crate::logs::SaidOnce,
    pub tls: NodeTls,
    /// Connections per client address (`limits.max_connections_per_ip`).
    pub client_connections: Arc<ConnectionTable>,
    /// Per core: whether its Redis client had a connection when it last looked (see
    /// [`Core::watch_redis`]); each written by its core, read by every core's `/readyz` and
    /// by `/metrics` (`pinboard_redis_connected`).
    pub redis_reached: Box<[AtomicBool]>,
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
            (Some(cert), Some(key)) => {
                Some(ServerTls::load(cert, key, config.http.h2).map_err(|e| {
                    let key = match e.file {
                        PemFile::Key => "tls.key_file",
                        _ => "tls.cert_file",
                    };
                    named(key)(e)
                })?)
            }
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
    pub fn new(
        settings: Settings,
        tls: NodeTls,
        config_file: Option<std::path::PathBuf>,
    ) -> Shared {
        let config = settings.config.clone();
        Shared {
            tls,
            counters: (0..config.cores())
                .map(|_| CoreCounters::default())
                .collect(),
            client_connections: ConnectionTable::new(config.limits.max_connections_per_ip),
            redis_reached: (0..config.cores())
                .map(|_| AtomicBool::new(false))
                .collect(),
            config,
            settings: LiveSettings::new(settings),
            config_file,
            stopping: AtomicBool::new(false),
            standing: StandingFlag::default(),
            started: Instant::now(),
            workers: Arc::default(),
            last_quarantine_ms: AtomicU64::new(0),
            sweeps: SweepCounters::default(),
            mirror: crate::mirror::Mirror::default(),
            heartbeat_refusals: crate::logs::SaidOnce::default(),
        }
    }

    /// The current settings, for work off the cores' request path (a core uses [`Core::live`]).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.current()
    }

    /// Makes `settings` the current generation; the per-address connection limit follows.
    pub fn replace_settings(&self, settings: Settings) {
        (self.client_connections).set_limit(settings.config.limits.max_connections_per_ip);
        self.settings.replace(settings);
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
        self.standing.is_serving()
    }

    /// Per core, in order: whether it reached Redis when it last looked.
    pub fn cores_reaching_redis(&self) -> Vec<bool> {
        (self.redis_reached.iter())
            .map(|reached| reached.load(Ordering::Relaxed))
            .collect()
    }

    /// Whether every core but `except` reached Redis when it last looked.
    pub fn other_cores_reach_redis(&self, except: usize) -> bool {
        (self.redis_reached.iter().enumerate())
            .all(|(core, reached)| core == except || reached.load(Ordering::Relaxed))
    }
}

pub struct Core {
    pub shared: Arc<Shared>,
    /// This core's position among the node's cores.
    pub index: usize,
    pub store: Store,
    pub upstreams: Upstreams,
    /// This core's view of the current settings, and the generation it was built for.
    live: RefCell<Rc<Live>>,
    seen: Cell<u64>,
}

/// One core's view of one generation of [`Settings`]: the settings, and the core's own state
/// built from them.
pub struct Live {
    pub settings: Arc<Settings>,
    /// This core's share of `limits.new_placements_per_ip_per_s`, when it is on.
    pub placement_rate: Option<Rc<PlacementRate>>,
    /// This core's access log, when it is on.
    pub access_log: Option<Rc<AccessLog>>,
}

impl Live {
    /// `previous`: the core's view of the generation before, whose state is kept where the
    /// settings it was built from did not change (a placement rate's buckets, an access log's
    /// buffer and open file).
    fn new(settings: Arc<Settings>, previous: Option<&Live>, cores: usize) -> Live {
        let config = &settings.config;
        let rate = config.limits.new_placements_per_ip_per_s;
        let placement_rate = match previous {
            Some(previous)
                if previous.settings.config.limits.new_placements_per_ip_per_s == rate =>
            {
                previous.placement_rate.clone()
            }
            _ => PlacementRate::new(rate, cores).map(Rc::new),
        };
        let access_log = match (previous, &settings.access_log) {
            (Some(previous), Some(setup))
                if previous
                    .access_log
                    .as_ref()
                    .is_some_and(|log| log.writes_to(setup)) =>
            {
                previous.access_log.clone()
            }
            (_, setup) => (setup.clone())
                .map(|setup| Rc::new(AccessLog::new(setup, config.node_id.as_str().into()))),
        };
        Live {
            placement_rate,
            access_log,
            settings,
        }
    }

    pub fn config(&self) -> &Config {
        &self.settings.config
    }
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
            config.ledger.cap(),
        );
        let upstreams = Upstreams::new(
            config.forwards.max_inflight,
            Duration::from_millis(config.forwards.upstream_idle_timeout_ms),
            shared.workers.clone(),
        );
        let seen = shared.settings.generation();
        let live = Live::new(shared.settings(), None, config.cores());
        Core {
            live: RefCell::new(Rc::new(live)),
            seen: Cell::new(seen),
            shared,
            index,
            store,
            upstreams,
        }
    }

    /// The current settings as this core sees them: one relaxed look at the generation a
    /// request, the lock taken only after a reload.
    pub fn live(&self) -> Rc<Live> {
        let generation = self.shared.settings.generation();
        if generation != self.seen.get() {
            let next = Live::new(
                self.shared.settings(),
                Some(&self.live.borrow()),
                self.shared.config.cores(),
            );
            // The access log replaced (its lines are written out when the last request
            // holding it is done).
            self.live.replace(Rc::new(next));
            self.seen.set(generation);
        }
        self.live.borrow().clone()
    }

    pub fn counters(&self) -> &CoreCounters {
        &self.shared.counters[self.index]
    }

    /// Until `stop`: every `every`, whether this core's Redis client has a connection, for
    /// the other cores' `/readyz` (a node with one core cut off from Redis is not ready: the
    /// requests that core accepts would be answered 503).
    pub async fn watch_redis(&self, every: Duration, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let reached = self.store.redis.reachable();
            self.shared.redis_reached[self.index].store(reached, Ordering::Relaxed);
            monoio::select! {
                _ = &mut stop => return,
                _ = monoio::time::sleep(every) => {}
            }
        }
    }
}
