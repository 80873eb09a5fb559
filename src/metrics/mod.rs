//! Counters the node keeps about itself: resolution outcomes and open connections per core,
//! summed per node for `/registry/health` and rendered as Prometheus text for `GET /metrics`.
//!
//! Each core owns one [`CoreCounters`] and is its only writer, so a relaxed increment never
//! contends; readers sum across cores. The process's own families (its build, CPU, memory and
//! descriptors) are read at scrape time, in [`process`].

pub mod histogram;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use histogram::{Histogram, Merged};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use prometheus_client::registry::Unit;

mod process;

/// Resolution outcomes, in the order the spec lists them (plus `takeover-denied`, and
/// `unavailable` for a request Redis could not answer, contract §8; `rate-limited` and
/// `namespace-full` for a new placement refused by `limits.new_placements_per_ip_per_s` and
/// `placement.max_rows_per_namespace`; `paused` for an id an operator paused; `unreplicated`
/// for a new placement strict mode released).
pub const OUTCOMES: [&str; 16] = [
    "forward",
    "unknown-ns",
    "no-backends",
    "quarantine",
    "not-serving",
    "no-hostname-workers",
    "binding-quarantine",
    "takeover-pending",
    "env-conflict",
    "nack",
    "takeover-denied",
    "unavailable",
    "rate-limited",
    "namespace-full",
    "paused",
    "unreplicated",
];

/// Why a client connection was closed at accept, for `pinboard_connections_refused_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionRefusal {
    /// The node had `max_connections` open.
    MaxConnections = 0,
    /// The client's address had `limits.max_connections_per_ip` open.
    PerIp,
    /// The client's address had its most TLS handshakes in progress.
    HandshakesPerIp,
    /// A balancer `proxy_protocol.trusted` names sent no whole, valid PROXY header in time.
    ProxyHeader,
}

impl ConnectionRefusal {
    pub const ALL: [ConnectionRefusal; 4] = [
        ConnectionRefusal::MaxConnections,
        ConnectionRefusal::PerIp,
        ConnectionRefusal::HandshakesPerIp,
        ConnectionRefusal::ProxyHeader,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConnectionRefusal::MaxConnections => "max_connections",
            ConnectionRefusal::PerIp => "per_ip",
            ConnectionRefusal::HandshakesPerIp => "handshakes_per_ip",
            ConnectionRefusal::ProxyHeader => "proxy_header",
        }
    }
}

/// The fleet as the registry last said, for the gauges: what the mirror poll (`crate::mirror`)
/// reads and `/metrics` renders; defined here, so that rendering depends on no poll.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetView {
    /// Live workers (lease not run out) per (namespace, hostname, env) — hostname and env
    /// empty in single mode: how many, how many of them draining, how many degraded.
    pub workers: BTreeMap<(String, String, String), WorkerCounts>,
    /// Placement rows per (namespace, env) over every bucket (placed or not yet swept).
    pub placements: BTreeMap<(String, String), u64>,
    /// The node holding the sweeper lease, if any.
    pub sweeper: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    pub live: u64,
    pub draining: u64,
    pub degraded: u64,
}

/// Why a forward failed at the worker, for `pinboard_upstream_errors_total{kind}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection (or TLS handshake) could be made: 502, the worker never saw the request.
    Connect = 0,
    /// No answer head within `forwards.timeout_ms`: 504.
    Timeout,
    /// Closed or reset before a complete answer: 502.
    Reset,
    /// An answer that is not HTTP/1.1 (or a `101` nobody asked for): 502.
    Invalid,
    /// A pooled connection found closed while the request was sent, and the request sent again
    /// on a fresh one (not a failure the client saw).
    StaleRetry,
}

impl UpstreamError {
    pub const ALL: [UpstreamError; 5] = [
        UpstreamError::Connect,
        UpstreamError::Timeout,
        UpstreamError::Reset,
        UpstreamError::Invalid,
        UpstreamError::StaleRetry,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Reset => "reset",
            UpstreamError::Invalid => "invalid",
            UpstreamError::StaleRetry => "stale_retry",
        }
    }
}

/// Why an idle pooled connection was dropped when it was taken, for
/// `pinboard_upstream_pool_dropped_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolDrop {
    /// Idle past `forwards.upstream_idle_timeout_ms` (or the worker's shorter keep-alive).
    Expired = 0,
    /// The worker closed it while it was idle (found by the check before reuse).
    Closed,
}

impl PoolDrop {
    pub const ALL: [PoolDrop; 2] = [PoolDrop::Expired, PoolDrop::Closed];

    pub fn name(self) -> &'static str {
        match self {
            PoolDrop::Expired => "expired",
            PoolDrop::Closed => "closed",
        }
    }
}

/// What a request was, for `pinboard_http_requests_total{kind}` and the duration histograms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RequestKind {
    /// `{ns}/{id}…`, and any path that is no route of the node's.
    #[default]
    Data = 0,
    /// The worker protocol's routes (`pinboard:worker`).
    Registry,
    /// The operator's routes (`pinboard:operator`), `/metrics` included.
    Operator,
    /// `/healthz`, `/readyz`.
    Health,
}

impl RequestKind {
    pub const ALL: [RequestKind; 4] = [
        RequestKind::Data,
        RequestKind::Registry,
        RequestKind::Operator,
        RequestKind::Health,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Data => "data",
            RequestKind::Registry => "registry",
            RequestKind::Operator => "operator",
            RequestKind::Health => "health",
        }
    }
}

/// Lua scripts a node may time (the store has 21).
pub const MAX_SCRIPTS: usize = 32;

/// The protocols requests come by, as the access log names them (nginx's `$server_protocol`).
pub const PROTOCOLS: [&str; 3] = ["HTTP/1.0", "HTTP/1.1", "HTTP/2"];

/// `version`'s entry in [`PROTOCOLS`] (HTTP/1.0 for anything older; no decoder of ours makes
/// another).
fn protocol_index(version: http::Version) -> usize {
    match version {
        http::Version::HTTP_11 => 1,
        http::Version::HTTP_2 => 2,
        _ => 0,
    }
}

/// The protocol a request came by, as the access log and the metrics name it.
pub fn protocol_name(version: http::Version) -> &'static str {
    PROTOCOLS[protocol_index(version)]
}

/// Status classes, `1xx` to `5xx`: bounded labels, as RED dashboards read them.
const CODES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

#[derive(Default)]
pub struct CoreCounters {
    outcomes: [AtomicU64; OUTCOMES.len()],
    /// New placements the data plane made (a resolve minted an epoch).
    placements: AtomicU64,
    /// Strict mode: new placements released because the replicas did not acknowledge them.
    strict_wait_failures: AtomicU64,
    /// Answers by kind and status class.
    requests: [[AtomicU64; CODES.len()]; RequestKind::ALL.len()],
    /// Requests answered on the client listener, by protocol ([`PROTOCOLS`]).
    protocols: [AtomicU64; PROTOCOLS.len()],
    /// From the request head read to the answer written, by kind.
    request_durations: [Histogram; RequestKind::ALL.len()],
    /// From a forward's first byte to the worker to the end of its answer relayed.
    upstream_durations: Histogram,
    /// Each Lua script's calls, from sending to the reply, by the script's index.
    script_durations: [Histogram; MAX_SCRIPTS],
    upstream_errors: [AtomicU64; UpstreamError::ALL.len()],
    pool_dropped: [AtomicU64; PoolDrop::ALL.len()],
    /// Client connections open on this core (a gauge).
    connections: AtomicU64,
    /// Connections closed at accept, by why.
    refused: [AtomicU64; ConnectionRefusal::ALL.len()],
}

impl CoreCounters {
    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn connection_refused(&self, reason: ConnectionRefusal) {
        self.refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one answer and how long it took.
    pub fn answered(&self, kind: RequestKind, status: u16, took: Duration) {
        let class = usize::from(status / 100).clamp(1, CODES.len()) - 1;
        self.requests[kind as usize][class].fetch_add(1, Ordering::Relaxed);
        self.request_durations[kind as usize].observe(took);
    }

    /// Counts one request answered on the client listener, by the protocol it came by.
    pub fn served_over(&self, version: http::Version) {
        self.protocols[protocol_index(version)].fetch_add(1, Ordering::Relaxed);
    }

    /// Times one call of the script at `index` (past [`MAX_SCRIPTS`], not counted).
    pub fn script_took(&self, index: usize, took: Duration) {
        if let Some(histogram) = self.script_durations.get(index) {
            histogram.observe(took);
        }
    }

    pub fn upstream_took(&self, took: Duration) {
        self.upstream_durations.observe(took);
    }

    pub fn upstream_error(&self, kind: UpstreamError) {
        self.upstream_errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn pool_dropped(&self, reason: PoolDrop) {
        self.pool_dropped[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one new placement.
    pub fn placed(&self) {
        self.placements.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request strict mode refused: a new placement released (its WAIT fell short),
    /// or a row too young to forward without one that fell short.
    pub fn strict_wait_failed(&self) {
        self.strict_wait_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one outcome; `name` must be one of [`OUTCOMES`].
    pub fn count(&self, name: &str) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == name) {
            self.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the sweeper did on this node (contract §6): written by the one task that sweeps.
#[derive(Default)]
pub struct SweepCounters {
    /// Passes run (each while this node held the sweeper lease).
    pub passes: AtomicU64,
    /// Placement rows deleted: their owner gone or dead.
    pub rows: AtomicU64,
    /// Overwritten markers deleted: their id had no row.
    pub markers: AtomicU64,
    /// Wakes answered 200: the instance resident, its entry off the schedule.
    pub woken: AtomicU64,
    /// Wakes answered 202, otherwise or not at all: tried again the next pass.
    pub wakes_pending: AtomicU64,
}

/// Every core's counters, summed.
pub fn outcomes(cores: &[CoreCounters]) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    OUTCOMES.iter().enumerate().map(move |(i, name)| {
        let total = cores
            .iter()
            .map(|c| c.outcomes[i].load(Ordering::Relaxed))
            .sum();
        (*name, total)
    })
}

/// Every core's requests by protocol, summed: ([`PROTOCOLS`] name, count).
pub fn protocols(cores: &[CoreCounters]) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    PROTOCOLS
        .iter()
        .enumerate()
        .map(move |(i, name)| (*name, sum(cores, |c| &c.protocols[i])))
}

/// Every core's new placements, summed.
pub fn new_placements(cores: &[CoreCounters]) -> u64 {
    sum(cores, |c| &c.placements)
}

/// Every core's strict-mode WAITs that fell short, summed.
pub fn strict_wait_failures(cores: &[CoreCounters]) -> u64 {
    sum(cores, |c| &c.strict_wait_failures)
}

/// Every core's upstream errors, summed, by kind.
pub fn upstream_errors(cores: &[CoreCounters]) -> Vec<(&'static str, u64)> {
    UpstreamError::ALL
        .iter()
        .map(|k| (k.name(), sum(cores, |c| &c.upstream_errors[*k as usize])))
        .collect()
}

/// Every core's connections closed at accept, summed, by reason.
pub fn connections_refused(cores: &[CoreCounters]) -> Vec<(&'static str, u64)> {
    ConnectionRefusal::ALL
        .iter()
        .map(|r| (r.name(), sum(cores, |c| &c.refused[*r as usize])))
        .collect()
}

/// Every core's dropped pooled connections, summed, by reason.
pub fn pool_dropped(cores: &[CoreCounters]) -> Vec<(&'static str, u64)> {
    PoolDrop::ALL
        .iter()
        .map(|r| (r.name(), sum(cores, |c| &c.pool_dropped[*r as usize])))
        .collect()
}

/// Every core's answers, summed: (kind, status class, count), each class of each kind.
pub fn requests(cores: &[CoreCounters]) -> Vec<(&'static str, &'static str, u64)> {
    let mut all = Vec::with_capacity(RequestKind::ALL.len() * CODES.len());
    for kind in RequestKind::ALL {
        for (class, code) in CODES.iter().enumerate() {
            let n = sum(cores, |c| &c.requests[kind as usize][class]);
            all.push((kind.name(), *code, n));
        }
    }
    all
}

/// Every core's request durations merged, by kind.
pub fn request_durations(cores: &[CoreCounters]) -> Vec<(&'static str, Merged)> {
    RequestKind::ALL
        .iter()
        .map(|k| {
            let of_kind = cores.iter().map(|c| &c.request_durations[*k as usize]);
            (k.name(), Merged::of(of_kind))
        })
        .collect()
}

/// Every core's script durations merged, labelled by `names` (the store's list, by index).
pub fn script_durations(
    cores: &[CoreCounters],
    names: &[&'static str],
) -> Vec<(&'static str, Merged)> {
    names
        .iter()
        .take(MAX_SCRIPTS)
        .enumerate()
        .map(|(i, name)| {
            (
                *name,
                Merged::of(cores.iter().map(|c| &c.script_durations[i])),
            )
        })
        .collect()
}

/// Every core's forward durations merged.
pub fn upstream_durations(cores: &[CoreCounters]) -> Merged {
    Merged::of(cores.iter().map(|c| &c.upstream_durations))
}

fn sum(cores: &[CoreCounters], of: impl Fn(&CoreCounters) -> &AtomicU64) -> u64 {
    cores.iter().map(|c| of(c).load(Ordering::Relaxed)).sum()
}

/// What `/metrics` reports, read once per scrape.
#[derive(Debug)]
pub struct Snapshot {
    pub outcomes: Vec<(&'static str, u64)>,
    pub connections: u64,
    /// Connections closed at accept, by reason ([`ConnectionRefusal`]).
    pub connections_refused: Vec<(&'static str, u64)>,
    pub uptime_secs: f64,
    pub serving: bool,
    /// Per core, by index: whether its Redis client had a connection (read every 50 ms).
    pub redis_connected: Vec<bool>,
    /// New placements this node's data plane made.
    pub placements: u64,
    /// New placements strict mode released: the replicas did not acknowledge them in time.
    pub strict_wait_failures: u64,
    /// Sweeper passes this node ran.
    pub sweeps: u64,
    /// What they deleted, by kind (`placement`, `overwritten`).
    pub swept: Vec<(&'static str, u64)>,
    /// The durability sweep's wakes, by result (`woken`, `pending`).
    pub wakes: Vec<(&'static str, u64)>,
    /// Answers by (kind, status class).
    pub requests: Vec<(&'static str, &'static str, u64)>,
    /// Requests on the client listener by protocol.
    pub protocols: Vec<(&'static str, u64)>,
    /// Request durations by kind.
    pub request_durations: Vec<(&'static str, Merged)>,
    /// Forward durations.
    pub upstream_durations: Merged,
    /// Lua script call durations, by script.
    pub script_durations: Vec<(&'static str, Merged)>,
    /// Forwards that failed at the worker, by kind ([`UpstreamError`]).
    pub upstream_errors: Vec<(&'static str, u64)>,
    /// Pooled connections dropped when taken, by reason ([`PoolDrop`]).
    pub pool_dropped: Vec<(&'static str, u64)>,
    /// Per worker (advertise URL): forwards in flight, idle pooled connections.
    pub workers: Vec<(String, u64, u64)>,
    /// The fleet as the mirror poll read it.
    pub fleet: std::sync::Arc<FleetView>,
    /// Label workers and placements with hostname and env (hostname-aware mode).
    pub hostname_aware: bool,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let families = [
            (
                "pinboard_resolutions",
                "Placement resolutions on this node, by outcome",
                "outcome",
                &self.outcomes,
            ),
            (
                "pinboard_swept_rows",
                "What this node's sweeper passes deleted, by kind",
                "kind",
                &self.swept,
            ),
            (
                "pinboard_wakes",
                "Wakes this node's durability sweep sent: woken (200) or pending (202, another status, no answer)",
                "result",
                &self.wakes,
            ),
            (
                "pinboard_upstream_errors",
                "Forwards that failed at the worker, by kind (connect, timeout, reset, invalid), and stale pooled connections a request was sent again after (stale_retry)",
                "kind",
                &self.upstream_errors,
            ),
            (
                "pinboard_http_requests_by_protocol",
                "Requests this node answered on its client listener, by the protocol they came by (HTTP/1.0, HTTP/1.1, HTTP/2)",
                "protocol",
                &self.protocols,
            ),
            (
                "pinboard_connections_refused",
                "Client connections closed at accept: max_connections were open on the node, limits.max_connections_per_ip from the address (per_ip), or its most TLS handshakes in progress (handshakes_per_ip)",
                "reason",
                &self.connections_refused,
            ),
            (
                "pinboard_upstream_pool_dropped",
                "Idle pooled worker connections dropped when taken: expired (past the idle timeout) or closed (by the worker)",
                "reason",
                &self.pool_dropped,
            ),
        ];
        for (name, help, label, samples) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (value, n) in samples {
                ConstCounter::new(*n).encode(family.encode_family(&[(label, *value)])?)?;
            }
        }
        let counters = [
            (
                "pinboard_sweeps",
                "Sweeper passes this node ran while holding the sweeper lease",
                self.sweeps,
            ),
            (
                "pinboard_placements",
                "New placements this node's data plane made: a resolve that minted an epoch for an id (a forward to an existing owner is not one)",
                self.placements,
            ),
            (
                "pinboard_strict_wait_failures",
                "Strict mode: new placements released (and answered 503) because fewer than redis.wait_replicas replicas acknowledged them within redis.wait_timeout_ms, or the WAIT failed",
                self.strict_wait_failures,
            ),
        ];
        for (name, help, n) in counters {
            let counter = ConstCounter::new(n);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        self.encode_requests(&mut encoder)?;
        self.encode_redis_connected(&mut encoder)?;
        self.encode_fleet(&mut encoder)?;
        self.encode_workers(&mut encoder)?;
        let gauges = [
            (
                "pinboard_connections",
                "Client connections open on this node",
                self.connections as f64,
            ),
            (
                "pinboard_uptime_seconds",
                "Seconds since this node started",
                self.uptime_secs,
            ),
            (
                "pinboard_serving",
                "1 while this node is the serving fleet",
                f64::from(u8::from(self.serving)),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

impl Snapshot {
    /// Answers by kind and status class, and the duration histograms.
    fn encode_requests(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut requests = encoder.encode_descriptor(
            "pinboard_http_requests",
            "Answers this node gave, by kind of request (data, registry, operator, health) and status class",
            None,
            MetricType::Counter,
        )?;
        for (kind, code, n) in &self.requests {
            let labels = [("kind", *kind), ("code", *code)];
            ConstCounter::new(*n).encode(requests.encode_family(&labels)?)?;
        }
        let seconds = Unit::Seconds;
        let mut durations = encoder.encode_descriptor(
            "pinboard_http_request_duration",
            "Time from a request's head read to its answer written, by kind of request",
            Some(&seconds),
            MetricType::Histogram,
        )?;
        for (kind, merged) in &self.request_durations {
            encode_histogram(durations.encode_family(&[("kind", *kind)])?, merged)?;
        }
        let upstream = encoder.encode_descriptor(
            "pinboard_upstream_duration",
            "Time from a forward's first byte sent to the worker to the end of its answer relayed",
            Some(&seconds),
            MetricType::Histogram,
        )?;
        encode_histogram(upstream, &self.upstream_durations)?;
        let mut scripts = encoder.encode_descriptor(
            "pinboard_redis_duration",
            "Time from a Lua script's call sent to Redis to its reply, by script",
            Some(&seconds),
            MetricType::Histogram,
        )?;
        for (script, merged) in &self.script_durations {
            encode_histogram(scripts.encode_family(&[("script", *script)])?, merged)?;
        }
        Ok(())
    }

    /// Per worker this node talks to: forwards in flight and idle pooled connections.
    fn encode_workers(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let families = [
            (
                "pinboard_upstream_inflight",
                "Forwards in flight to a worker from this node, by advertise URL",
            ),
            (
                "pinboard_upstream_idle_connections",
                "Idle pooled connections to a worker on this node, by advertise URL",
            ),
        ];
        for (i, (name, help)) in families.into_iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (url, inflight, idle) in &self.workers {
                let n = if i == 0 { *inflight } else { *idle };
                ConstGauge::new(n as i64)
                    .encode(family.encode_family(&[("worker", url.as_str())])?)?;
            }
        }
        Ok(())
    }

    /// One sample per core: 1 while its Redis client has a connection.
    fn encode_redis_connected(
        &self,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "pinboard_redis_connected",
            "1 while this core's Redis client has a connection (with Redis Cluster: to at least one master), read every 50 ms; a core at 0 answers its requests 503 and the node's /readyz 503",
            None,
            MetricType::Gauge,
        )?;
        for (core, connected) in self.redis_connected.iter().enumerate() {
            let core = core.to_string();
            ConstGauge::new(i64::from(*connected))
                .encode(family.encode_family(&[("core", core.as_str())])?)?;
        }
        Ok(())
    }

    /// The fleet gauges: workers by namespace and state (and hostname and env in
    /// hostname-aware mode), placement rows by namespace (and env), the sweeper's holder.
    fn encode_fleet(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut workers = encoder.encode_descriptor(
            "pinboard_fleet_workers",
            "Live workers by namespace and state (live, draining, degraded), from the mirror poll",
            None,
            MetricType::Gauge,
        )?;
        for ((ns, hostname, env), counts) in &self.fleet.workers {
            for (state, n) in [
                ("live", counts.live),
                ("draining", counts.draining),
                ("degraded", counts.degraded),
            ] {
                let gauge = ConstGauge::new(n as i64);
                if self.hostname_aware {
                    let labels = [
                        ("namespace", ns.as_str()),
                        ("hostname", hostname.as_str()),
                        ("env", env.as_str()),
                        ("state", state),
                    ];
                    gauge.encode(workers.encode_family(&labels)?)?;
                } else {
                    let labels = [("namespace", ns.as_str()), ("state", state)];
                    gauge.encode(workers.encode_family(&labels)?)?;
                }
            }
        }
        let mut placements = encoder.encode_descriptor(
            "pinboard_fleet_placement_rows",
            "Placement rows by namespace over every bucket, from the mirror poll",
            None,
            MetricType::Gauge,
        )?;
        for ((ns, env), n) in &self.fleet.placements {
            let gauge = ConstGauge::new(*n as i64);
            if self.hostname_aware {
                let labels = [("namespace", ns.as_str()), ("env", env.as_str())];
                gauge.encode(placements.encode_family(&labels)?)?;
            } else {
                gauge.encode(placements.encode_family(&[("namespace", ns.as_str())])?)?;
            }
        }
        let mut sweeper = encoder.encode_descriptor(
            "pinboard_sweeper",
            "1 for the node holding the sweeper lease (none while nobody holds it)",
            None,
            MetricType::Gauge,
        )?;
        if let Some(node) = &self.fleet.sweeper {
            ConstGauge::new(1i64).encode(sweeper.encode_family(&[("node", node.as_str())])?)?;
        }
        Ok(())
    }
}

fn encode_histogram(
    mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    merged: &Merged,
) -> Result<(), std::fmt::Error> {
    encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        merged.sum,
        merged.count,
        &merged.buckets,
        None,
    )
}

/// The exposition formats a scraper can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4, what every scraper reads (the default).
    Prometheus,
    /// OpenMetrics 1.0.0 text, for a scraper whose `Accept` names it.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for.
    pub fn from_accept(accept: Option<&[u8]>) -> Format {
        let wants = accept.is_some_and(|a| {
            a.split(|b| *b == b',').any(|range| {
                let media = range.split(|b| *b == b';').next().unwrap_or_default();
                media
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"application/openmetrics-text")
            })
        });
        if wants {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The snapshot as text in `format`, followed by the process's own families, read now.
///
/// prometheus-client writes OpenMetrics only. Our families are counters and gauges, for which
/// Prometheus text differs in three ways, applied here: a counter's `# HELP` and `# TYPE` name
/// its sample (`…_total`), there is no `# UNIT`, and no `# EOF`.
pub fn render(snapshot: Snapshot, format: Format) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    registry.register_collector(Box::new(process::Process::read()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    if format == Format::OpenMetrics {
        return Ok(text);
    }
    let counters: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .map(str::to_owned)
        .collect();
    let mut prometheus = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .iter()
                .any(|c| c == name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        prometheus.push_str(renamed.as_deref().unwrap_or(line));
        prometheus.push('\n');
    }
    Ok(prometheus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            outcomes: vec![("forward", 3)],
            connections: 2,
            connections_refused: vec![("per_ip", 1)],
            uptime_secs: 1.5,
            serving: true,
            redis_connected: vec![true, false],
            placements: 6,
            strict_wait_failures: 1,
            sweeps: 4,
            swept: vec![("placement", 2), ("overwritten", 1)],
            wakes: vec![("woken", 1), ("pending", 3)],
            requests: vec![("data", "2xx", 5)],
            protocols: vec![("HTTP/2", 4)],
            request_durations: vec![("data", Merged::default())],
            upstream_durations: Merged::default(),
            script_durations: vec![("resolve", Merged::default())],
            upstream_errors: vec![("connect", 1)],
            pool_dropped: vec![("closed", 2)],
            workers: vec![("http://127.0.0.1:9001".into(), 3, 4)],
            fleet: Default::default(),
            hostname_aware: false,
        }
    }

    #[test]
    fn accept_picks_the_format() {
        for (accept, format) in [
            (None, Format::Prometheus),
            (Some("text/plain"), Format::Prometheus),
            (Some("*/*"), Format::Prometheus),
            (
                Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
                Format::OpenMetrics,
            ),
            (
                Some("text/plain, Application/OpenMetrics-Text"),
                Format::OpenMetrics,
            ),
        ] {
            assert_eq!(
                Format::from_accept(accept.map(str::as_bytes)),
                format,
                "{accept:?}"
            );
        }
    }

    #[test]
    fn prometheus_text_names_counter_samples_and_has_no_eof() {
        let text = render(snapshot(), Format::Prometheus).unwrap();
        assert!(
            text.contains("# TYPE pinboard_resolutions_total counter\n"),
            "{text}"
        );
        assert!(text.contains("pinboard_resolutions_total{outcome=\"forward\"} 3\n"));
        assert!(text.contains("# TYPE pinboard_connections gauge\n"));
        assert!(text.contains(
            "pinboard_redis_connected{core=\"0\"} 1\npinboard_redis_connected{core=\"1\"} 0\n"
        ));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
        let open = render(snapshot(), Format::OpenMetrics).unwrap();
        assert!(open.contains("# TYPE pinboard_resolutions counter\n"));
        assert!(open.ends_with("# EOF\n"));
    }

    #[test]
    fn the_process_families_follow_the_snapshot() {
        let text = render(snapshot(), Format::Prometheus).unwrap();
        let commit = format!("commit=\"{}\"", env!("PINBOARD_COMMIT"));
        let build = text
            .lines()
            .find(|l| l.starts_with("pinboard_build_info{"))
            .unwrap();
        assert!(build.contains(&commit) && build.ends_with("} 1"), "{build}");
        for family in [
            "process_cpu_seconds_total counter",
            "process_resident_memory_bytes gauge",
            "process_virtual_memory_bytes gauge",
            "process_open_fds gauge",
            "process_max_fds gauge",
            "process_start_time_seconds gauge",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{text}");
        }
        let open = render(snapshot(), Format::OpenMetrics).unwrap();
        assert!(
            open.contains("# TYPE process_cpu_seconds counter\n"),
            "{open}"
        );
        assert!(open.contains("\nprocess_cpu_seconds_total "), "{open}");
    }

    /// `docs/metrics.md` lists every family the node renders, by its name in Prometheus text.
    #[test]
    fn every_family_is_in_the_metrics_doc() {
        const DOC: &str = include_str!("../../docs/metrics.md");
        let text = render(snapshot(), Format::Prometheus).unwrap();
        let missing: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .filter(|name| !DOC.contains(&format!("`{name}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/metrics.md does not list {missing:?}"
        );
    }
}
