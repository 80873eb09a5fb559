//! The node's configuration (contract §1, §5): defaults, overlaid by an optional TOML file,
//! overlaid by `PINBOARD_*` environment variables. Every key is validated before anything starts,
//! so a bad value stops startup with one line naming the key; and the effective configuration is
//! rendered back as TOML, secrets masked, for `pinboard check-config`.
//!
//! `keys` holds the one table of settings (name, parser, environment form, rendering); `env`
//! maps environment variables onto that table.

#[cfg(test)]
mod documented;
mod env;
mod keys;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ipnet::IpNet;
use toml::{Table, Value};

use crate::passport::Retiring;
use crate::redis::RedisTarget;

pub use env::{ignored as ignored_env, process_env};
/// The event-loop I/O driver: `pinboard-http`'s, shared with the workers.
pub use pinboard_http::DriverKind;

/// Everything a node needs to start. Build it with [`Config::load`]; every field has already been
/// validated there.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Address of the listening socket; each event-loop thread binds its own `SO_REUSEPORT`
    /// listener on it. Default `127.0.0.1:8080`; an IP literal, not a host name.
    pub listen: SocketAddr,
    /// Event-loop threads, at most 1024. Default 0 = one per available core (resolved by the
    /// runtime, not here).
    pub threads: usize,
    /// I/O driver: `auto` (io_uring, epoll where the kernel refuses it), `io_uring`, `epoll`.
    pub driver: DriverKind,
    /// Where Redis lives: `redis://[[user]:password@]host:port[/db]`, or
    /// `redis-cluster://[[user]:password@]host:port[,host:port…]` for Redis Cluster seeds;
    /// `rediss://…` and `rediss-cluster://…` speak TLS. Default `redis://127.0.0.1:6379`.
    pub redis_url: RedisTarget,
    /// CA certificates (PEM) trusted for a `rediss` Redis besides the system roots.
    pub redis_ca_file: Option<PathBuf>,
    /// Prefix of every Redis key. Default `pinboard:`; non-empty, without whitespace, `{` or `}`
    /// (braces would break the `{bucket}` cluster hash tag in the key layout).
    pub prefix: String,
    /// Number of placement buckets, 1–16384 (the number of Redis Cluster hash slots). Default 16.
    /// Part of the fleet license: every node of a fleet must agree.
    pub shards: u32,
    /// Hostname-aware mode: placements are keyed by the request's Host and workers bind
    /// (hostname, namespace) to an env. Default false. Part of the fleet license.
    pub hostname_aware: bool,
    /// Worker lease TTL in ms, 1000–3600000. Default 15000. Below a second a heartbeat (which
    /// re-probes the worker) cannot reliably renew in time; above an hour a dead worker keeps its
    /// placements, and a cold-started bucket its quarantine, for longer than anyone would want,
    /// so a larger value is almost certainly a unit mistake.
    pub lease_ttl_ms: u64,
    /// Timeout of the registration / heartbeat challenge probe in ms, 1–86400000. Default 2500.
    pub verify_timeout_ms: u64,
    /// Bound on one Redis request, from sending it to its reply, in ms, 1–86400000. Default
    /// 2000. Past it the request answers 503 `registry unavailable, retry` (contract §8).
    pub redis_timeout_ms: u64,
    /// How often the sweeper (the one node holding the sweeper lease) runs its pass in ms,
    /// 100–86400000. Default 5000 (contract §6).
    pub sweep_interval_ms: u64,
    /// Prefix of `/registry/*` and of the data plane; `/healthz`, `/readyz` and `/metrics` stay at
    /// the root. Default "" (the root); otherwise a path like `/edge`: a leading `/`, no trailing
    /// `/`, no empty segment, no `?`, `#` or whitespace. Nothing is normalised: write it exactly.
    pub base_path: String,
    /// Affinity is honoured while the preferred worker's headroom ≥ mean / balance_factor.
    /// A finite number ≥ 1.0; default 2.0. 1.0 drops affinity as soon as a worker is below mean.
    pub balance_factor: f64,
    /// What keeps a client on the same worker: `ip` (the client address, see `trusted_proxies`),
    /// `none`, `header:NAME`, `query:NAME` or `cookie:NAME`. Default `ip`.
    pub affinity: Affinity,
    /// Peers whose `X-Forwarded-For` is believed when computing the client address: CIDRs, a bare
    /// IP meaning /32 (IPv4) or /128 (IPv6). Default empty: the peer address is the client.
    pub trusted_proxies: Vec<IpNet>,
    /// Limits on forwards to workers.
    pub forwards: Forwards,
    /// Serve `GET /metrics` on `listen` (with an operator credential). Default true.
    pub metrics: bool,
    /// A second address serving only `GET /metrics`, without credentials, for a scraper on a
    /// private network (whatever `metrics` says). Default unset.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the operator console (`/_console/`, outside `base_path`) on `listen` and, when set,
    /// on `metrics_listen`. Default false: the paths are then the data plane's.
    pub console: bool,
    /// This node's fleet-license epoch: a node with a higher epoch takes the license over.
    /// Default 0; at most 2^63 − 1 (TOML integers are signed 64-bit).
    pub fleet_epoch: u64,
    /// This node's name in cluster membership: non-empty, no whitespace. Default: random at
    /// start (`node-` + 12 hex digits), so set it when a stable name matters.
    pub node_id: String,
    /// Keys that verify Passport credentials. At least one must be configured.
    pub passport: PassportConfig,
    /// Data-plane Passport rules, keyed by namespace (`"/ns"`). Only namespaces listed here
    /// require a credential. Set in the file only (contract §5):
    /// `[namespaces."/ns"]` / `scopes = ["read"]`.
    pub namespaces: BTreeMap<String, NamespaceRule>,
    /// Client connections this node keeps open at once, 1–10000000. Default 16384: past it a new
    /// connection is closed at accept (counted in `/metrics`), so a flood of idle connections
    /// cannot exhaust memory or file descriptors.
    pub max_connections: u64,
    /// How log lines are written to stderr: `text` (default; coloured only on a terminal) or
    /// `json` (one JSON object a line, for log shippers).
    pub log_format: LogFormat,
    /// Which log lines are written: a `tracing` filter (`info`, `warn`,
    /// `info,pinboard::proxy=debug`). Default `info`. `PINBOARD_LOG`, when set, wins over it.
    pub log_level: String,
    /// The access log: `off` (default), `text` or `json`, one line per request.
    pub access_log: AccessLogFormat,
    /// Where the access log goes: unset, standard output; set, this file (appended to, and
    /// reopened on `SIGUSR1`).
    pub access_log_path: Option<PathBuf>,
    /// A file the serving node writes its process id to once it listens (replaced by the new
    /// process of a binary upgrade, removed when the node exits cleanly), for `pinboard reload`
    /// and init systems. Default unset.
    pub pid_file: Option<PathBuf>,
    /// What one registration may ask for.
    pub registry: RegistryLimits,
    /// Limits of the HTTP front end (not in the contract: Pinboard's own addition).
    pub http: HttpLimits,
    /// The listener's certificate pair: set, the listener speaks HTTPS only.
    pub tls: ListenerTls,
    /// What one client may hold or make: connections and new placements.
    pub limits: ClientLimits,
    /// Bounds on placement rows.
    pub placement: PlacementLimits,
    /// The ownership ledger: every change of an instance's owner or fence, kept per bucket.
    pub ledger: LedgerSettings,
    /// Load balancers that send the PROXY protocol (`src/runtime/accept.rs`).
    pub proxy_protocol: ProxyProtocol,
    /// Strict mode: how many Redis replicas must hold a new placement before it is forwarded.
    pub redis: StrictWrites,
}

/// What one client may hold or make (`src/limits/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Connections one address (an IPv6 /64) may hold open on the node, 0–10000000; past it
    /// a new one is closed at accept. Default 1024; 0 turns the per-address limits off (this
    /// one and the TLS handshakes in progress per address).
    pub max_connections_per_ip: u64,
    /// New placements per second one client (its address, or the `sub` of its data-plane
    /// credential) may make, 0–1000000: 429 past it. Default 200; 0 is no limit.
    pub new_placements_per_ip_per_s: u64,
}

/// Bounds on placement rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementLimits {
    /// Rows an (env, namespace) may hold, 1–1000000000, before a new placement there answers
    /// 503. Default unset: no limit.
    pub max_rows_per_namespace: Option<u64>,
}

/// The ownership ledger (`src/store/README.md`): a capped stream per bucket that every script
/// changing an owner or a fence appends to, read by `GET /registry/history`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerSettings {
    /// Whether those scripts append. Default true; false writes nothing (what is kept stays
    /// readable).
    pub enabled: bool,
    /// Entries one bucket's stream keeps, about (`XADD … MAXLEN ~`: trimmed a node of 100
    /// entries at a time), 100–100000000. Default 100000.
    pub max_entries_per_bucket: u64,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        LedgerSettings {
            enabled: true,
            max_entries_per_bucket: 100_000,
        }
    }
}

impl LedgerSettings {
    /// The cap the scripts are given, `None` with the ledger off.
    pub fn cap(&self) -> Option<u64> {
        self.enabled.then_some(self.max_entries_per_bucket)
    }
}

/// Who must open a connection with a PROXY protocol header (v1 or v2), and whose header then
/// names the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyProtocol {
    /// CIDRs (a bare IP: /32 or /128) of the load balancers in front of the node. A connection
    /// from one must start with a PROXY header, whose source address becomes the connection's
    /// client address (its `X-Forwarded-For`, the `ip` affinity key, the access log, the limits
    /// per address); one from any other address is served as HTTP, where a PROXY header is a
    /// malformed request (400). Default empty: the protocol is off.
    pub trusted: Vec<IpNet>,
}

impl ProxyProtocol {
    /// Whether a connection from `peer` must start with a PROXY header.
    pub fn expected_from(&self, peer: std::net::IpAddr) -> bool {
        in_cidrs(&self.trusted, peer)
    }
}

/// Whether `ip` is in one of `cidrs` (`trusted_proxies`, `proxy_protocol.trusted`); an
/// IPv4-mapped IPv6 address, what a dual-stack listener sees of an IPv4 peer, as that IPv4.
pub fn in_cidrs(cidrs: &[IpNet], ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    cidrs.iter().any(|net| net.contains(&ip))
}

/// Strict mode (`src/placement/strict.rs`): after any script that writes a placement, the node
/// sends `WAIT wait_replicas wait_timeout_ms` and forwards only once that many replicas hold
/// the write; otherwise the placement is released and the request answers 503.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrictWrites {
    /// Replicas that must acknowledge a placement write, 0–100. Default 0: no WAIT (strict mode
    /// off).
    pub wait_replicas: u32,
    /// How long WAIT may block, in ms, 1–86400000 and below `redis_timeout_ms` when
    /// `wait_replicas` is set (the WAIT is a Redis request like any other). Default 100: a
    /// healthy replica acknowledges within a round trip (well under a millisecond on a LAN, a
    /// few across zones), and a refused placement should not cost its client much more than
    /// that; 100 ms also rides over a replica's short stall (a fork for a snapshot).
    pub wait_timeout_ms: u64,
}

impl Default for StrictWrites {
    fn default() -> Self {
        StrictWrites {
            wait_replicas: 0,
            wait_timeout_ms: 100,
        }
    }
}

/// The listener's certificate chain and private key (PEM), both or neither. `SIGHUP` reads
/// both again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerTls {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!(r#"expected "text" or "json", got {s:?}"#)),
        }
    }
}

/// The access log's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    Off,
    /// `key=value` pairs after an RFC 3339 time.
    Text,
    /// One JSON object a line.
    Json,
}

impl fmt::Display for AccessLogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessLogFormat::Off => "off",
            AccessLogFormat::Text => "text",
            AccessLogFormat::Json => "json",
        })
    }
}

impl FromStr for AccessLogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<AccessLogFormat, String> {
        match s {
            "off" => Ok(AccessLogFormat::Off),
            "text" => Ok(AccessLogFormat::Text),
            "json" => Ok(AccessLogFormat::Json),
            _ => Err(format!(r#"expected "off", "text" or "json", got {s:?}"#)),
        }
    }
}

/// What keeps a client on the same worker (rendezvous-hashed over candidates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// The client address (the peer, or `X-Forwarded-For` from a trusted proxy).
    Ip,
    /// No preference: power-of-two choice only.
    None,
    /// A request header's value; the name is stored lowercased.
    Header(String),
    /// A query parameter's value.
    Query(String),
    /// A cookie's value.
    Cookie(String),
}

/// Limits on forwards to workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwards {
    /// Upstream timeout in ms, 1–86400000: 504 `upstream timeout` past it. Default 30000.
    pub timeout_ms: u64,
    /// In-flight forwards per worker, > 0: 503 past it. Default 1024.
    pub max_inflight: u32,
    /// CA certificates (PEM) trusted for `https` workers besides the system roots.
    pub ca_file: Option<PathBuf>,
    /// Longest time a pooled worker connection is kept idle, in ms, 0–86400000 (0: none is
    /// reused). Default 4000, below the 5 s keep-alive of uvicorn, Node and the like; a worker's
    /// shorter `Keep-Alive: timeout` wins.
    pub upstream_idle_timeout_ms: u64,
    /// The `Upgrade` protocols tunnelled to a worker (names, lowercased; a version after `/`
    /// goes with its name). An upgrade to any other is forwarded as a plain request without
    /// its `Upgrade`, and a worker's `101` to it is a 502. Default `["websocket"]`.
    pub upgrade_protocols: Vec<String>,
    /// Whether a client's `Authorization` the data-plane passport consumed still reaches the
    /// worker (it has the identity in the attestation's `acct` either way). Default false.
    pub keep_authorization: bool,
}

/// Keys that verify Passport credentials (contract §2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassportConfig {
    /// Shared secret for HS256 credentials. Unset by default; when set, at least 32 bytes.
    pub hs256_secret: Option<String>,
    /// More HS256 secrets, any of which verifies (with `hs256_secret`): a secret is rotated by
    /// adding the new one, then removing the old. Each is a string or
    /// `{ key = "…", not_after = 2027-01-01T00:00:00Z }` (past `not_after` it verifies nothing).
    /// Default empty.
    pub hs256_secrets: Vec<Retiring<String>>,
    /// PEM files of Ed25519 public keys for EdDSA credentials, each a path or
    /// `{ key = "path", not_after = … }`. Each must be a readable file; relative paths are taken
    /// from the working directory. Default empty.
    pub ed25519_public_keys: Vec<Retiring<PathBuf>>,
    /// When set (non-empty), a credential's `iss` must equal it.
    pub issuer: Option<String>,
    /// When set (non-empty), a credential's `aud` must equal (or contain) it.
    pub audience: Option<String>,
}

/// A data-plane Passport rule for one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceRule {
    /// Scopes a credential for the namespace must all carry: non-empty, each without whitespace
    /// (credential scopes are space-separated, so such a scope could never match).
    pub scopes: Vec<String>,
}

/// What one registration may ask for: the bounds that keep every registry script call of a
/// worker short, whatever the worker sends (`SECURITY.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryLimits {
    /// Namespaces one registration may serve, 1–1024: past it 400. Default 64. Each is a
    /// namespace list the worker's copy joins in every bucket.
    pub max_namespaces_per_worker: usize,
    /// Held ids one registration may list in `instances` (all namespaces together),
    /// 0–10000000: past it 400. Default 100000. They are reclaimed 1,000 per script call.
    pub max_instances_per_register: usize,
}

/// Limits of the HTTP front end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time allowed for a request's headers to arrive, in ms, 1–86400000. Default 10000.
    pub header_timeout_ms: u64,
    /// How long an idle keep-alive connection is kept, in ms, 1–86400000. Default 75000.
    pub idle_timeout_ms: u64,
    /// Largest request head (request line + headers) in bytes, 1024–1048576: 431 past it.
    /// Default 16384.
    pub max_header_bytes: usize,
    /// On shutdown, how long in-flight requests may finish, in ms, 0–86400000. Default 10000.
    pub shutdown_grace_ms: u64,
    /// On SIGTERM/SIGINT, how long `/readyz` answers 503 while the node still accepts and serves,
    /// before it stops accepting, in ms, 0–600000 (so load balancers and Kubernetes endpoints
    /// stop sending first). Default 0.
    pub shutdown_delay_ms: u64,
    /// How long a client may take no bytes of its answer before the connection is closed (and
    /// the forward's upstream connection and inflight slot released), in ms, 1–86400000.
    /// Default 60000, as nginx's `send_timeout`.
    pub write_timeout_ms: u64,
    /// HTTP/2 offered by ALPN (`h2`) on the TLS listener. Default true.
    pub h2: bool,
    /// HTTP/2 by prior knowledge (h2c) on a plain listener: a connection that starts with the
    /// HTTP/2 preface is served as HTTP/2. Default false.
    pub h2c: bool,
    /// Streams one HTTP/2 connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`),
    /// 1–65535. Default 128.
    pub h2_max_streams: u32,
}

/// Why the configuration was refused. Displays as one line naming the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("config error: {key}: {message}")]
pub struct ConfigError {
    /// The offending key (dotted, as in the file), environment variable, or file path.
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Default for Config {
    /// The documented defaults, `node_id` derived from this host and the default `listen`
    /// ([`default_node_id`]). No Passport key is configured, so this alone does not pass
    /// [`Config::load`].
    fn default() -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            threads: 0,
            driver: DriverKind::Auto,
            redis_url: RedisTarget::parse("redis://127.0.0.1:6379")
                .expect("the default Redis URL parses"),
            redis_ca_file: None,
            prefix: "pinboard:".into(),
            shards: 16,
            hostname_aware: false,
            lease_ttl_ms: 15_000,
            verify_timeout_ms: 2_500,
            redis_timeout_ms: 2_000,
            sweep_interval_ms: 5_000,
            base_path: String::new(),
            balance_factor: 2.0,
            affinity: Affinity::Ip,
            trusted_proxies: Vec::new(),
            forwards: Forwards {
                timeout_ms: 30_000,
                max_inflight: 1024,
                ca_file: None,
                upstream_idle_timeout_ms: 4_000,
                upgrade_protocols: vec!["websocket".into()],
                keep_authorization: false,
            },
            metrics: true,
            metrics_listen: None,
            console: false,
            fleet_epoch: 0,
            node_id: default_node_id(SocketAddr::from(([127, 0, 0, 1], 8080))),
            passport: PassportConfig::default(),
            namespaces: BTreeMap::new(),
            max_connections: 16_384,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            access_log: AccessLogFormat::Off,
            access_log_path: None,
            pid_file: None,
            registry: RegistryLimits {
                max_namespaces_per_worker: 64,
                max_instances_per_register: 100_000,
            },
            http: HttpLimits {
                header_timeout_ms: 10_000,
                idle_timeout_ms: 75_000,
                max_header_bytes: 16 * 1024,
                shutdown_grace_ms: 10_000,
                shutdown_delay_ms: 0,
                write_timeout_ms: 60_000,
                h2: true,
                h2c: false,
                h2_max_streams: 128,
            },
            tls: ListenerTls::default(),
            limits: ClientLimits {
                max_connections_per_ip: 1024,
                new_placements_per_ip_per_s: 200,
            },
            placement: PlacementLimits::default(),
            ledger: LedgerSettings::default(),
            proxy_protocol: ProxyProtocol::default(),
            redis: StrictWrites::default(),
        }
    }
}

/// The `node_id` of a node that sets none: `{hostname}@{listen}` (`edge-7@0.0.0.0:8080`), the
/// same across restarts (a restart is no new node: its sweeper gauge keeps its series, its
/// membership entry is the one it had) and unique per node on a host, as one listen address
/// has one live node. The hostname is the kernel's; without one, or with a listen port of 0
/// (the kernel picks it when binding, after this is decided), `node-` and 12 random hex digits.
pub fn default_node_id(listen: SocketAddr) -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && !h.contains(char::is_whitespace));
    match hostname {
        Some(host) if listen.port() != 0 => format!("{host}@{listen}"),
        _ => format!("node-{:012x}", rand::random::<u64>() >> 16),
    }
}

impl Config {
    /// The number of event loops: `threads`, or one per available core when 0.
    pub fn cores(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// `file`: the TOML text of the config file and its path (for messages), if any. `env`: the
    /// process environment (`std::env::vars()` in production, a fixed list in tests).
    /// Environment variables win over the file, the file over the defaults.
    pub fn load(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Config::from_sources(file, env, None)
    }

    /// [`Config::load`]; `node_id`: the name when neither the file nor the environment sets
    /// one (else [`default_node_id`]).
    fn from_sources(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
        node_id: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some((path, text)) => parse_file(path, text)?,
            None => Table::new(),
        };
        let origins = Origins {
            file: file.map(|(path, _)| path),
            env: env::overlay(&mut table, env)?,
        };
        let mut config = Config::default();
        keys::apply(&mut config, &table).map_err(|e| origins.annotate(e))?;
        if !table.contains_key("node_id") {
            config.node_id = node_id.map_or_else(|| default_node_id(config.listen), str::to_owned);
        }
        config.require_passport_key()?;
        config
            .check_metrics_listen()
            .map_err(|e| origins.annotate(e))?;
        config.check_key_files().map_err(|e| origins.annotate(e))?;
        config
            .check_wait_timeout()
            .map_err(|e| origins.annotate(e))?;
        Ok(config)
    }

    /// The configuration a reload reads (the file as it is now, the process environment)
    /// for a node running with `running`: every key of [`RESTART_ONLY`] keeps its running
    /// value, and is named in the second list when the file asks for another. Refused as
    /// [`Config::load`] refuses.
    pub fn reload(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
        running: &Config,
    ) -> Result<(Config, Vec<&'static str>), ConfigError> {
        // A node_id left unset is the running one (a random default would be drawn again).
        let mut config = Config::from_sources(file, env, Some(&running.node_id))?;
        let kept = keep_running(&mut config, running);
        // Checked again against the running `redis_timeout_ms`, which a reload keeps.
        config.check_wait_timeout()?;
        Ok((config, kept))
    }

    /// The keys (and `namespaces`) whose value differs in `other`.
    pub fn differences(&self, other: &Config) -> Vec<&'static str> {
        let mut keys: Vec<&'static str> = keys::KEYS
            .iter()
            .filter(|key| (key.render)(self) != (key.render)(other))
            .map(|key| key.name)
            .collect();
        if self.namespaces != other.namespaces {
            keys.push(keys::NAMESPACES);
        }
        keys
    }

    /// The effective configuration as TOML text, with the Passport secrets and the Redis
    /// password shown as `***`. With the secrets put back, loading the text gives this `Config`.
    pub fn render_masked(&self) -> String {
        let mut out = String::new();
        let mut section = "";
        for key in keys::KEYS {
            let Some(value) = (key.render)(self) else {
                continue;
            };
            let value = if key.secret { masked(value) } else { value };
            // KEYS lists every top-level key before the first table, and each table's keys
            // together, so one header per change of table is a valid document.
            let (table, leaf) = key.name.rsplit_once('.').unwrap_or(("", key.name));
            if table != section {
                section = table;
                let _ = write!(out, "\n[{table}]\n");
            }
            let _ = writeln!(out, "{leaf} = {value}");
        }
        for (ns, rule) in &self.namespaces {
            let scopes: Vec<Value> = rule.scopes.iter().cloned().map(Value::String).collect();
            let _ = write!(
                out,
                "\n[namespaces.{}]\nscopes = {}\n",
                Value::String(ns.clone()),
                Value::Array(scopes)
            );
        }
        out
    }

    fn require_passport_key(&self) -> Result<(), ConfigError> {
        let passport = &self.passport;
        if passport.hs256_secret.is_none()
            && passport.hs256_secrets.is_empty()
            && passport.ed25519_public_keys.is_empty()
        {
            return Err(ConfigError::new(
                "passport",
                "no Passport key configured (there is no unauthenticated registry): set \
                 passport.hs256_secret (PINBOARD_PASSPORT__HS256_SECRET), \
                 passport.hs256_secrets or passport.ed25519_public_keys",
            ));
        }
        Ok(())
    }

    /// The metrics listener is a socket of its own: it cannot take the port of `listen` on an
    /// address `listen` covers too (an unspecified address covers every one).
    fn check_metrics_listen(&self) -> Result<(), ConfigError> {
        let (Some(metrics), listen) = (self.metrics_listen, self.listen) else {
            return Ok(());
        };
        let shared_ip = metrics.ip() == listen.ip()
            || metrics.ip().is_unspecified()
            || listen.ip().is_unspecified();
        if metrics.port() != 0 && metrics.port() == listen.port() && shared_ip {
            return Err(ConfigError::new(
                "metrics_listen",
                format!("{metrics} takes the port of listen ({listen}): pick another"),
            ));
        }
        Ok(())
    }

    /// Strict mode's WAIT is a Redis request: its timeout must end before the request's own
    /// bound (`redis_timeout_ms`) would give it up.
    fn check_wait_timeout(&self) -> Result<(), ConfigError> {
        let strict = &self.redis;
        if strict.wait_replicas > 0 && strict.wait_timeout_ms >= self.redis_timeout_ms {
            return Err(ConfigError::new(
                "redis.wait_timeout_ms",
                format!(
                    "must be below redis_timeout_ms ({}) while redis.wait_replicas is set, got {}",
                    self.redis_timeout_ms, strict.wait_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The PEM contents are parsed where the keys are used; here only that they can be read,
    /// and that the listener's certificate comes with its key.
    fn check_key_files(&self) -> Result<(), ConfigError> {
        let tls = &self.tls;
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "tls.key_file",
                    "required with tls.cert_file",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "tls.cert_file",
                    "required with tls.key_file",
                ));
            }
            _ => {}
        }
        let files = self
            .passport
            .ed25519_public_keys
            .iter()
            .map(|path| ("passport.ed25519_public_keys", &path.key))
            .chain(tls.cert_file.iter().map(|path| ("tls.cert_file", path)))
            .chain(tls.key_file.iter().map(|path| ("tls.key_file", path)))
            .chain(
                self.forwards
                    .ca_file
                    .iter()
                    .map(|path| ("forwards.ca_file", path)),
            )
            .chain(
                self.redis_ca_file
                    .iter()
                    .map(|path| ("redis_ca_file", path)),
            );
        for (key, path) in files {
            readable_file(path).map_err(|why| {
                ConfigError::new(key, format!("cannot read {}: {why}", path.display()))
            })?;
        }
        Ok(())
    }
}

/// A secret's rendering: each secret string `***` (in a list too, and a retiring key's `key`),
/// the rest (`not_after`) as it is.
fn masked(value: Value) -> Value {
    match value {
        Value::String(_) => Value::String("***".into()),
        Value::Array(items) => Value::Array(items.into_iter().map(masked).collect()),
        Value::Table(mut table) => {
            if let Some(key) = table.get_mut("key") {
                *key = masked(key.clone());
            }
            Value::Table(table)
        }
        other => other,
    }
}

/// Declares the keys only a restart changes, and how a reload keeps their running values.
macro_rules! restart_only {
    ($($first:ident $(. $rest:ident)*),* $(,)?) => {
        /// The keys only a restart changes: what the node's sockets, threads, Redis connections
        /// and fleet identity were built from. Every other key (and `namespaces`) is applied by
        /// a reload.
        pub const RESTART_ONLY: &[&str] = &[$(concat!(stringify!($first) $(, ".", stringify!($rest))*)),*];

        /// Puts `running`'s value back into `config` for each key of [`RESTART_ONLY`] they
        /// differ on; those keys' names.
        fn keep_running(config: &mut Config, running: &Config) -> Vec<&'static str> {
            let mut kept = Vec::new();
            $(
                if config.$first $(. $rest)* != running.$first $(. $rest)* {
                    config.$first $(. $rest)*.clone_from(&running.$first $(. $rest)*);
                    kept.push(concat!(stringify!($first) $(, ".", stringify!($rest))*));
                }
            )*
            kept
        }
    };
}

restart_only!(
    listen,
    threads,
    driver,
    redis_url,
    redis_ca_file,
    prefix,
    shards,
    hostname_aware,
    lease_ttl_ms,
    redis_timeout_ms,
    sweep_interval_ms,
    base_path,
    metrics_listen,
    fleet_epoch,
    node_id,
    log_format,
    pid_file,
    forwards.max_inflight,
    forwards.ca_file,
    forwards.upstream_idle_timeout_ms,
    http.h2,
    tls.cert_file,
    tls.key_file,
    ledger.enabled,
    ledger.max_entries_per_bucket,
);

/// The text of the configuration file at `path`, if one is given: read at start and by each
/// reload; the error is the one line that refuses it.
pub fn read_file(path: Option<&Path>) -> Result<Option<String>, String> {
    path.map(|path| {
        std::fs::read_to_string(path).map_err(|e| format!("config error: {}: {e}", path.display()))
    })
    .transpose()
}

/// A directory opens on Linux and a FIFO's open would wait for a writer: regular files only.
fn readable_file(path: &Path) -> Result<(), String> {
    crate::http::tls::open_regular_file(path)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn parse_file(path: &Path, text: &str) -> Result<Table, ConfigError> {
    text.parse::<Table>().map_err(|e| {
        let at = e.span().map_or(String::new(), |span| {
            let before = &text[..span.start];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" at line {line}, column {column}")
        });
        let why = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
        ConfigError::new(
            path.display().to_string(),
            format!("not valid TOML{at}: {why}"),
        )
    })
}

/// Where each key's value came from, so a message can point the operator at the right place.
struct Origins<'a> {
    file: Option<&'a Path>,
    /// Dotted key → the environment variable that set it.
    env: BTreeMap<String, String>,
}

impl Origins<'_> {
    fn annotate(&self, mut e: ConfigError) -> ConfigError {
        if let Some(var) = self.env.get(&e.key) {
            e.message = format!("{} (from {var})", e.message);
        } else if let Some(path) = self.file {
            e.message = format!("{} (in {})", e.message, path.display());
        }
        e
    }
}

impl fmt::Display for Affinity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Affinity::Ip => f.write_str("ip"),
            Affinity::None => f.write_str("none"),
            Affinity::Header(name) => write!(f, "header:{name}"),
            Affinity::Query(name) => write!(f, "query:{name}"),
            Affinity::Cookie(name) => write!(f, "cookie:{name}"),
        }
    }
}

impl FromStr for Affinity {
    type Err = String;

    fn from_str(s: &str) -> Result<Affinity, String> {
        match s.split_once(':') {
            None if s == "ip" => Ok(Affinity::Ip),
            None if s == "none" => Ok(Affinity::None),
            Some(("header", name)) if is_token(name) => {
                Ok(Affinity::Header(name.to_ascii_lowercase()))
            }
            // Cookie names are tokens too (RFC 6265 §4.1.1).
            Some(("cookie", name)) if is_token(name) => Ok(Affinity::Cookie(name.into())),
            // A name holding these could never match a parameter of a query string.
            Some(("query", name))
                if !name.is_empty()
                    && !name.contains(|c: char| c.is_whitespace() || "&=#".contains(c)) =>
            {
                Ok(Affinity::Query(name.into()))
            }
            _ => Err(format!(
                r#"expected "ip", "none", "header:NAME", "query:NAME" or "cookie:NAME" (NAME non-empty; a header or cookie NAME an HTTP token), got {s:?}"#
            )),
        }
    }
}

/// An HTTP token (RFC 9110 §5.6.2): what a header name may be.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: (&str, &str) = (
        "PINBOARD_PASSPORT__HS256_SECRET",
        "s3cret-0123456789abcdef0123456789",
    );

    type Vars = &'static [(&'static str, &'static str)];

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn from_file(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load(Some((Path::new("/etc/pinboard.toml"), text)), env(vars))
    }

    /// A file setting every key to something other than its default.
    const FULL_FILE: &str = r#"
listen = "0.0.0.0:9000"
threads = 4
driver = "epoll"
redis_url = "redis://:pw@10.0.0.5:6380/3"
prefix = "pb:"
shards = 64
hostname_aware = true
lease_ttl_ms = 20000
verify_timeout_ms = 1000
redis_timeout_ms = 700
sweep_interval_ms = 2500
base_path = "/edge"
balance_factor = 1.5
affinity = "header:X-User"
trusted_proxies = ["10.0.0.0/8", "::1"]
metrics = false
metrics_listen = "10.0.0.9:9901"
console = true
fleet_epoch = 7
node_id = "edge-1"
max_connections = 100
log_format = "json"
log_level = "warn,pinboard=info"
access_log = "json"
pid_file = "/run/pinboard/pinboard.pid"

[forwards]
timeout_ms = 5000
max_inflight = 10
upstream_idle_timeout_ms = 2500
upgrade_protocols = ["websocket", "Chat"]
keep_authorization = true

[passport]
hs256_secret = "file-secret-0123456789abcdef012345"
hs256_secrets = ["next-secret-0123456789abcdef0123456", { key = "old-secret-0123456789abcdef01234567", not_after = 2027-01-01T00:00:00Z }]
ed25519_public_keys = []
issuer = "https://issuer.example"
audience = "pinboard"

[namespaces."/threads"]
scopes = ["threads:read", "threads:write"]

[registry]
max_namespaces_per_worker = 8
max_instances_per_register = 500

[http]
header_timeout_ms = 1000
idle_timeout_ms = 2000
max_header_bytes = 4096
shutdown_grace_ms = 0
shutdown_delay_ms = 5000
write_timeout_ms = 3000
h2 = false
h2c = true
h2_max_streams = 64

[limits]
max_connections_per_ip = 50
new_placements_per_ip_per_s = 0

[placement]
max_rows_per_namespace = 5000

[ledger]
enabled = false
max_entries_per_bucket = 500

[proxy_protocol]
trusted = ["192.0.2.0/24", "2001:db8::1"]

[redis]
wait_replicas = 1
wait_timeout_ms = 50
"#;

    fn full() -> Config {
        Config {
            listen: "0.0.0.0:9000".parse().unwrap(),
            threads: 4,
            driver: DriverKind::Epoll,
            redis_url: RedisTarget::parse("redis://:pw@10.0.0.5:6380/3").unwrap(),
            redis_ca_file: None,
            prefix: "pb:".into(),
            shards: 64,
            hostname_aware: true,
            lease_ttl_ms: 20_000,
            verify_timeout_ms: 1_000,
            redis_timeout_ms: 700,
            sweep_interval_ms: 2_500,
            base_path: "/edge".into(),
            balance_factor: 1.5,
            affinity: Affinity::Header("x-user".into()),
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            forwards: Forwards {
                timeout_ms: 5_000,
                max_inflight: 10,
                ca_file: None,
                upstream_idle_timeout_ms: 2_500,
                upgrade_protocols: vec!["websocket".into(), "chat".into()],
                keep_authorization: true,
            },
            metrics: false,
            metrics_listen: Some("10.0.0.9:9901".parse().unwrap()),
            console: true,
            fleet_epoch: 7,
            node_id: "edge-1".into(),
            passport: PassportConfig {
                hs256_secret: Some("file-secret-0123456789abcdef012345".into()),
                hs256_secrets: vec![
                    "next-secret-0123456789abcdef0123456".to_owned().into(),
                    Retiring {
                        key: "old-secret-0123456789abcdef01234567".into(),
                        not_after: Some(1_798_761_600),
                    },
                ],
                ed25519_public_keys: vec![],
                issuer: Some("https://issuer.example".into()),
                audience: Some("pinboard".into()),
            },
            namespaces: BTreeMap::from([(
                "/threads".to_string(),
                NamespaceRule {
                    scopes: vec!["threads:read".into(), "threads:write".into()],
                },
            )]),
            max_connections: 100,
            log_format: LogFormat::Json,
            log_level: "warn,pinboard=info".into(),
            access_log: AccessLogFormat::Json,
            access_log_path: None,
            pid_file: Some("/run/pinboard/pinboard.pid".into()),
            registry: RegistryLimits {
                max_namespaces_per_worker: 8,
                max_instances_per_register: 500,
            },
            http: HttpLimits {
                header_timeout_ms: 1_000,
                idle_timeout_ms: 2_000,
                max_header_bytes: 4096,
                shutdown_grace_ms: 0,
                shutdown_delay_ms: 5_000,
                write_timeout_ms: 3_000,
                h2: false,
                h2c: true,
                h2_max_streams: 64,
            },
            tls: ListenerTls::default(),
            limits: ClientLimits {
                max_connections_per_ip: 50,
                new_placements_per_ip_per_s: 0,
            },
            placement: PlacementLimits {
                max_rows_per_namespace: Some(5_000),
            },
            ledger: LedgerSettings {
                enabled: false,
                max_entries_per_bucket: 500,
            },
            proxy_protocol: ProxyProtocol {
                trusted: vec![
                    "192.0.2.0/24".parse().unwrap(),
                    "2001:db8::1/128".parse().unwrap(),
                ],
            },
            redis: StrictWrites {
                wait_replicas: 1,
                wait_timeout_ms: 50,
            },
        }
    }

    #[test]
    fn defaults() {
        let config = Config::load(None, env(&[SECRET])).unwrap();
        let expected = Config {
            node_id: config.node_id.clone(),
            passport: PassportConfig {
                hs256_secret: Some("s3cret-0123456789abcdef0123456789".into()),
                ..PassportConfig::default()
            },
            ..Config::default()
        };
        assert_eq!(config, expected);
        assert_eq!(config.redis_url.masked(), "redis://127.0.0.1:6379/0");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(config.node_id, format!("{}@127.0.0.1:8080", host.trim()));
        let other = Config::load(None, env(&[SECRET])).unwrap();
        assert_eq!(
            config.node_id, other.node_id,
            "node_id is the same at every start"
        );
        let moved = Config::load(None, env(&[SECRET, ("PINBOARD_LISTEN", "0.0.0.0:9001")]));
        assert_eq!(
            moved.unwrap().node_id,
            format!("{}@0.0.0.0:9001", host.trim()),
            "and follows the listen address"
        );
        let picked = Config::load(None, env(&[SECRET, ("PINBOARD_LISTEN", "127.0.0.1:0")]));
        let picked = picked.unwrap().node_id;
        let hex = picked.strip_prefix("node-").unwrap();
        assert_eq!(hex.len(), 12, "a port the kernel picks: random");
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn file_only() {
        assert_eq!(from_file(FULL_FILE, &[]).unwrap(), full());
    }

    #[test]
    fn environment_overrides_file() {
        let config = from_file(
            FULL_FILE,
            &[
                ("PINBOARD_SHARDS", "128"),
                ("PINBOARD_FORWARDS__TIMEOUT_MS", "7000"),
                (
                    "PINBOARD_PASSPORT__HS256_SECRET",
                    "env-secret-0123456789abcdef0123456",
                ),
                ("PINBOARD_TRUSTED_PROXIES", ""),
                ("PINBOARD_PASSPORT__ISSUER", ""),
                ("PINBOARD_CONFIG", "/etc/pinboard.toml"),
                ("PINBOARD_LOG", "debug"),
                ("HOME", "/root"),
            ],
        )
        .unwrap();
        let mut expected = full();
        expected.shards = 128;
        expected.forwards.timeout_ms = 7_000;
        expected.passport.hs256_secret = Some("env-secret-0123456789abcdef0123456".into());
        expected.trusted_proxies = vec![];
        expected.passport.issuer = None;
        assert_eq!(config, expected);
    }

    #[test]
    fn every_key_has_an_environment_form() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.pem"), dir.path().join("b.pem"));
        std::fs::write(&a, "pem").unwrap();
        std::fs::write(&b, "pem").unwrap();
        let keys = format!("{}, {}", a.display(), b.display());
        let pem = a.display().to_string();
        let vars = [
            ("PINBOARD_LISTEN", "0.0.0.0:9000"),
            ("PINBOARD_THREADS", "4"),
            ("PINBOARD_DRIVER", "epoll"),
            ("PINBOARD_REDIS_URL", "redis://:pw@10.0.0.5:6380/3"),
            ("PINBOARD_REDIS_CA_FILE", &pem),
            ("PINBOARD_PREFIX", "pb:"),
            ("PINBOARD_SHARDS", "64"),
            ("PINBOARD_HOSTNAME_AWARE", "true"),
            ("PINBOARD_LEASE_TTL_MS", "20000"),
            ("PINBOARD_VERIFY_TIMEOUT_MS", "1000"),
            ("PINBOARD_REDIS_TIMEOUT_MS", "700"),
            ("PINBOARD_SWEEP_INTERVAL_MS", "2500"),
            ("PINBOARD_BASE_PATH", "/edge"),
            ("PINBOARD_BALANCE_FACTOR", "1.5"),
            ("PINBOARD_AFFINITY", "header:X-User"),
            ("PINBOARD_TRUSTED_PROXIES", "10.0.0.0/8,::1"),
            ("PINBOARD_FORWARDS__TIMEOUT_MS", "5000"),
            ("PINBOARD_FORWARDS__MAX_INFLIGHT", "10"),
            ("PINBOARD_FORWARDS__UPSTREAM_IDLE_TIMEOUT_MS", "2500"),
            ("PINBOARD_FORWARDS__UPGRADE_PROTOCOLS", "websocket, Chat"),
            ("PINBOARD_FORWARDS__KEEP_AUTHORIZATION", "true"),
            ("PINBOARD_METRICS", "false"),
            ("PINBOARD_METRICS_LISTEN", "10.0.0.9:9901"),
            ("PINBOARD_CONSOLE", "true"),
            ("PINBOARD_FLEET_EPOCH", "7"),
            ("PINBOARD_NODE_ID", "edge-1"),
            ("PINBOARD_MAX_CONNECTIONS", "100"),
            ("PINBOARD_LOG_FORMAT", "json"),
            ("PINBOARD_LOG_LEVEL", "warn,pinboard=info"),
            ("PINBOARD_ACCESS_LOG", "json"),
            ("PINBOARD_ACCESS_LOG_PATH", &pem),
            (
                "PINBOARD_PASSPORT__HS256_SECRET",
                "file-secret-0123456789abcdef012345",
            ),
            (
                "PINBOARD_PASSPORT__HS256_SECRETS",
                "next-secret-0123456789abcdef0123456, old-secret-0123456789abcdef01234567",
            ),
            ("PINBOARD_PASSPORT__ED25519_PUBLIC_KEYS", &keys),
            ("PINBOARD_PASSPORT__ISSUER", "https://issuer.example"),
            ("PINBOARD_REGISTRY__MAX_NAMESPACES_PER_WORKER", "8"),
            ("PINBOARD_REGISTRY__MAX_INSTANCES_PER_REGISTER", "500"),
            ("PINBOARD_PASSPORT__AUDIENCE", "pinboard"),
            ("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "1000"),
            ("PINBOARD_HTTP__IDLE_TIMEOUT_MS", "2000"),
            ("PINBOARD_HTTP__MAX_HEADER_BYTES", "4096"),
            ("PINBOARD_HTTP__SHUTDOWN_GRACE_MS", "0"),
            ("PINBOARD_HTTP__SHUTDOWN_DELAY_MS", "5000"),
            ("PINBOARD_PID_FILE", "/run/pinboard/pinboard.pid"),
            ("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "3000"),
            ("PINBOARD_FORWARDS__CA_FILE", &pem),
            ("PINBOARD_TLS__CERT_FILE", &pem),
            ("PINBOARD_TLS__KEY_FILE", &pem),
            ("PINBOARD_LIMITS__MAX_CONNECTIONS_PER_IP", "50"),
            ("PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S", "0"),
            ("PINBOARD_PLACEMENT__MAX_ROWS_PER_NAMESPACE", "5000"),
            ("PINBOARD_LEDGER__ENABLED", "false"),
            ("PINBOARD_LEDGER__MAX_ENTRIES_PER_BUCKET", "500"),
            (
                "PINBOARD_PROXY_PROTOCOL__TRUSTED",
                "192.0.2.0/24, 2001:db8::1",
            ),
            ("PINBOARD_REDIS__WAIT_REPLICAS", "1"),
            ("PINBOARD_REDIS__WAIT_TIMEOUT_MS", "50"),
            ("PINBOARD_HTTP__H2", "false"),
            ("PINBOARD_HTTP__H2C", "true"),
            ("PINBOARD_HTTP__H2_MAX_STREAMS", "64"),
        ];
        assert_eq!(vars.len(), keys::KEYS.len(), "one variable per key");
        let config = Config::load(None, env(&vars)).unwrap();
        let mut expected = full();
        expected.namespaces.clear();
        expected.forwards.ca_file = Some(a.clone());
        expected.redis_ca_file = Some(a.clone());
        expected.access_log_path = Some(a.clone());
        expected.tls = ListenerTls {
            cert_file: Some(a.clone()),
            key_file: Some(a.clone()),
        };
        expected.passport.ed25519_public_keys = vec![a.into(), b.into()];
        // The environment names no `not_after`.
        expected.passport.hs256_secrets[1].not_after = None;
        assert_eq!(config, expected);
    }

    #[test]
    fn bad_values_name_their_key() {
        // (file text, environment, key, a fragment of the message)
        let cases: &[(&str, Vars, &str, &str)] = &[
            ("listen = \"localhost:80\"", &[], "listen", "127.0.0.1:8080"),
            ("listen = 80", &[], "listen", "expected a string, got 80"),
            (
                "",
                &[("PINBOARD_LISTEN", "1.2.3.4")],
                "listen",
                "PINBOARD_LISTEN",
            ),
            (
                "metrics_listen = \"localhost:9901\"",
                &[],
                "metrics_listen",
                "127.0.0.1:8080",
            ),
            (
                "listen = \"0.0.0.0:9000\"\nmetrics_listen = \"127.0.0.1:9000\"",
                &[],
                "metrics_listen",
                "takes the port of listen (0.0.0.0:9000)",
            ),
            (
                "",
                &[("PINBOARD_METRICS_LISTEN", "127.0.0.1:8080")],
                "metrics_listen",
                "(from PINBOARD_METRICS_LISTEN)",
            ),
            ("threads = 1025", &[], "threads", "from 0 to 1024, got 1025"),
            (
                "[limits]\nmax_connections_per_ip = -1",
                &[],
                "limits.max_connections_per_ip",
                "from 0 to 10000000, got -1",
            ),
            (
                "",
                &[("PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S", "1.5")],
                "limits.new_placements_per_ip_per_s",
                "PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S",
            ),
            (
                "[placement]\nmax_rows_per_namespace = 0",
                &[],
                "placement.max_rows_per_namespace",
                "from 1 to 1000000000, got 0",
            ),
            (
                "[ledger]\nmax_entries_per_bucket = 99",
                &[],
                "ledger.max_entries_per_bucket",
                "from 100 to 100000000, got 99",
            ),
            (
                "",
                &[("PINBOARD_LEDGER__ENABLED", "off")],
                "ledger.enabled",
                "PINBOARD_LEDGER__ENABLED",
            ),
            (
                "[redis]\nwait_replicas = -1",
                &[],
                "redis.wait_replicas",
                "from 0 to 100, got -1",
            ),
            (
                "",
                &[("PINBOARD_REDIS__WAIT_REPLICAS", "one")],
                "redis.wait_replicas",
                "got \"one\" (from PINBOARD_REDIS__WAIT_REPLICAS)",
            ),
            (
                "[redis]\nwait_timeout_ms = 0",
                &[],
                "redis.wait_timeout_ms",
                "from 1 to 86400000, got 0",
            ),
            (
                "redis_timeout_ms = 500\n[redis]\nwait_replicas = 1\nwait_timeout_ms = 500",
                &[],
                "redis.wait_timeout_ms",
                "must be below redis_timeout_ms (500) while redis.wait_replicas is set, got 500",
            ),
            (
                "",
                &[
                    ("PINBOARD_REDIS__WAIT_REPLICAS", "2"),
                    ("PINBOARD_REDIS__WAIT_TIMEOUT_MS", "2000"),
                ],
                "redis.wait_timeout_ms",
                "(from PINBOARD_REDIS__WAIT_TIMEOUT_MS)",
            ),
            ("threads = -1", &[], "threads", "got -1"),
            ("threads = 1.5", &[], "threads", "got 1.5"),
            ("driver = \"uring\"", &[], "driver", "got \"uring\""),
            (
                "redis_url = \"http://x:1\"",
                &[],
                "redis_url",
                "expected redis[s]://",
            ),
            (
                "redis_url = \"rediss://under_score!:6380\"",
                &[],
                "redis_url",
                "over TLS the host must be a DNS name or an IP address",
            ),
            (
                "redis_url = \"redis://h\"",
                &[],
                "redis_url",
                "not host:port",
            ),
            ("prefix = \"\"", &[], "prefix", "got \"\""),
            ("prefix = \"a b\"", &[], "prefix", "whitespace"),
            ("prefix = \"pb{x}:\"", &[], "prefix", "hash tag"),
            (
                "shards = \"x\"",
                &[],
                "shards",
                "from 1 to 16384, got \"x\"",
            ),
            ("shards = 0", &[], "shards", "got 0"),
            ("shards = 16385", &[], "shards", "got 16385"),
            (
                "",
                &[("PINBOARD_SHARDS", "abc")],
                "shards",
                "got \"abc\" (from PINBOARD_SHARDS)",
            ),
            ("", &[("PINBOARD_SHARDS", "")], "shards", "got \"\""),
            (
                "hostname_aware = \"yes\"",
                &[],
                "hostname_aware",
                "true or false",
            ),
            (
                "",
                &[("PINBOARD_METRICS", "1")],
                "metrics",
                "true or false, got \"1\"",
            ),
            (
                "lease_ttl_ms = 999",
                &[],
                "lease_ttl_ms",
                "from 1000 to 3600000",
            ),
            ("lease_ttl_ms = 3600001", &[], "lease_ttl_ms", "got 3600001"),
            ("verify_timeout_ms = 0", &[], "verify_timeout_ms", "got 0"),
            ("base_path = \"edge\"", &[], "base_path", "got \"edge\""),
            ("base_path = \"/\"", &[], "base_path", "got \"/\""),
            ("base_path = \"/edge/\"", &[], "base_path", "trailing"),
            ("base_path = \"/a//b\"", &[], "base_path", "got \"/a//b\""),
            ("base_path = \"/a?b\"", &[], "base_path", "got \"/a?b\""),
            ("base_path = \"/a b\"", &[], "base_path", "got \"/a b\""),
            (
                "balance_factor = 0.5",
                &[],
                "balance_factor",
                "≥ 1.0, got 0.5",
            ),
            ("balance_factor = nan", &[], "balance_factor", "got nan"),
            ("balance_factor = inf", &[], "balance_factor", "got inf"),
            (
                "",
                &[("PINBOARD_BALANCE_FACTOR", "inf")],
                "balance_factor",
                "got inf",
            ),
            ("balance_factor = true", &[], "balance_factor", "got true"),
            ("affinity = \"header:\"", &[], "affinity", "header:NAME"),
            (
                "affinity = \"header:a b\"",
                &[],
                "affinity",
                "got \"header:a b\"",
            ),
            ("affinity = \"query:\"", &[], "affinity", "got \"query:\""),
            (
                "affinity = \"cookie:a;b\"",
                &[],
                "affinity",
                "got \"cookie:a;b\"",
            ),
            ("affinity = \"IP\"", &[], "affinity", "got \"IP\""),
            (
                "trusted_proxies = \"10.0.0.0/8\"",
                &[],
                "trusted_proxies",
                "expected an array",
            ),
            (
                "trusted_proxies = [\"10.0.0.0/33\"]",
                &[],
                "trusted_proxies",
                "item 1",
            ),
            (
                "",
                &[("PINBOARD_TRUSTED_PROXIES", "::1,,")],
                "trusted_proxies",
                "item 2",
            ),
            (
                "[proxy_protocol]\ntrusted = [\"10.0.0.0/8\", \"lb.internal\"]",
                &[],
                "proxy_protocol.trusted",
                "item 2",
            ),
            (
                "",
                &[("PINBOARD_PROXY_PROTOCOL__TRUSTED", "10.0.0.0/8 192.0.2.1")],
                "proxy_protocol.trusted",
                "item 1",
            ),
            (
                "forwards.timeout_ms = \"abc\"",
                &[],
                "forwards.timeout_ms",
                "got \"abc\"",
            ),
            (
                "forwards.max_inflight = 0",
                &[],
                "forwards.max_inflight",
                "got 0",
            ),
            (
                "forwards.upgrade_protocols = [\"websocket\", \"h2c\\r\\nX: y\"]",
                &[],
                "forwards.upgrade_protocols",
                "item 2",
            ),
            (
                "",
                &[("PINBOARD_FORWARDS__UPGRADE_PROTOCOLS", "websocket,,")],
                "forwards.upgrade_protocols",
                "item 2",
            ),
            ("forwards = 5", &[], "forwards", "expected a table, got 5"),
            (
                "forwards = 5",
                &[("PINBOARD_FORWARDS__TIMEOUT_MS", "1")],
                "forwards",
                "table",
            ),
            ("fleet_epoch = -1", &[], "fleet_epoch", "got -1"),
            (
                "",
                &[("PINBOARD_FLEET_EPOCH", "18446744073709551615")],
                "fleet_epoch",
                "got",
            ),
            ("node_id = \"\"", &[], "node_id", "got \"\""),
            ("node_id = \"a b\"", &[], "node_id", "got \"a b\""),
            (
                "passport.hs256_secret = 5",
                &[],
                "passport.hs256_secret",
                "expected a string",
            ),
            (
                "passport.hs256_secret = \"\"",
                &[],
                "passport.hs256_secret",
                "non-empty",
            ),
            (
                "passport.issuer = \"\"",
                &[],
                "passport.issuer",
                "non-empty",
            ),
            (
                "passport.ed25519_public_keys = [\"\"]",
                &[],
                "passport.ed25519_public_keys",
                "item 1",
            ),
            (
                "http.max_header_bytes = 1023",
                &[],
                "http.max_header_bytes",
                "got 1023",
            ),
            (
                "http.idle_timeout_ms = 0",
                &[],
                "http.idle_timeout_ms",
                "got 0",
            ),
            (
                "http.shutdown_grace_ms = -1",
                &[],
                "http.shutdown_grace_ms",
                "got -1",
            ),
            (
                "",
                &[("PINBOARD_HTTP__SHUTDOWN_DELAY_MS", "600001")],
                "http.shutdown_delay_ms",
                "from 0 to 600000, got 600001",
            ),
            ("pid_file = \"\"", &[], "pid_file", ""),
        ];
        for (file, vars, key, fragment) in cases {
            let mut vars = vars.to_vec();
            // The secret from the environment would override a bad one in the file.
            if !file.contains("hs256_secret") {
                vars.push(SECRET);
            }
            let e = from_file(file, &vars).expect_err(file);
            assert_eq!(e.key, *key, "{file} {vars:?}: {e}");
            assert!(e.message.contains(fragment), "{file} {vars:?}: {e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }

    #[test]
    fn error_says_where_the_value_came_from() {
        let e = from_file("shards = 0", &[SECRET]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config error: shards: expected a whole number from 1 to 16384, got 0 \
             (in /etc/pinboard.toml)"
        );
        let e = Config::load(
            None,
            env(&[SECRET, ("PINBOARD_FORWARDS__TIMEOUT_MS", "abc")]),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config error: forwards.timeout_ms: expected a whole number from 1 to 86400000, \
             got \"abc\" (from PINBOARD_FORWARDS__TIMEOUT_MS)"
        );
    }

    #[test]
    fn unparseable_toml_is_one_line_naming_the_file() {
        let e = from_file("shards = 1\nlisten = \n", &[SECRET]).unwrap_err();
        assert_eq!(e.key, "/etc/pinboard.toml");
        assert!(e.message.starts_with("not valid TOML at line 2"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        let e = from_file("shards = 1\nshards = 2\n", &[SECRET]).unwrap_err();
        assert_eq!(e.key, "/etc/pinboard.toml", "{e}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let cases: &[(&str, Vars, &str)] = &[
            ("shard = 4", &[], "shard"),
            ("[forwards]\ntimeout = 4", &[], "forwards.timeout"),
            ("[passport]\nsecret = \"x\"", &[], "passport.secret"),
            ("[cache]\nsize = 1", &[], "cache"),
            ("forwards.timeout_ms.x = 1", &[], "forwards.timeout_ms"),
            (
                "[namespaces.\"/a\"]\nscopes = [\"x\"]\nscope = \"y\"",
                &[],
                "namespaces.\"/a\".scope",
            ),
        ];
        for (file, vars, key) in cases {
            let mut vars = vars.to_vec();
            vars.push(SECRET);
            let e = from_file(file, &vars).unwrap_err();
            assert_eq!(e.key, *key, "{file} {vars:?}: {e}");
        }
    }

    /// In the file an unknown key is a mistake; in the environment it may be anyone's
    /// (contract §10): ignored, and named by `ignored_env`.
    #[test]
    fn unknown_variables_are_ignored() {
        let vars = [
            SECRET,
            ("PINBOARD_SHARD", "4"),
            ("PINBOARD_FORWARDS_TIMEOUT_MS", "4"),
            ("PINBOARD_FORWARDS", "4"),
            ("PINBOARD_NAMESPACES__X", "y"),
        ];
        let config = Config::load(None, env(&vars)).unwrap();
        assert_eq!((config.shards, config.forwards.timeout_ms), (16, 30_000));
        let warning = ignored_env(vars.iter().map(|(k, _)| *k)).unwrap();
        for (name, _) in &vars[1..] {
            assert!(warning.contains(name), "{warning}");
        }
        assert!(warning.contains("PINBOARD_SHARD (did you mean PINBOARD_SHARDS?)"));
        assert!(warning.contains("config file only"), "{warning}");
    }

    #[test]
    fn an_hs256_secret_under_32_bytes_is_refused() {
        let short = (
            "PINBOARD_PASSPORT__HS256_SECRET",
            "31-bytes-31-bytes-31-bytes-31-b",
        );
        let e = Config::load(None, env(&[short])).unwrap_err();
        assert_eq!(e.key, "passport.hs256_secret");
        assert!(
            e.message
                .contains("at least 32 bytes (RFC 7518 §3.2), got 31"),
            "{e}"
        );
        let e = from_file("[passport]\nhs256_secret = \"short\"", &[]).unwrap_err();
        assert_eq!(e.key, "passport.hs256_secret");
        let ok = (
            "PINBOARD_PASSPORT__HS256_SECRET",
            "32-bytes-32-bytes-32-bytes-32-by",
        );
        assert!(Config::load(None, env(&[ok])).is_ok());
    }

    #[test]
    fn a_passport_key_is_required() {
        let e = Config::load(None, env(&[])).unwrap_err();
        assert_eq!(e.key, "passport");
        let e = from_file("", &[]).unwrap_err();
        assert!(
            !e.message.contains("pinboard.toml"),
            "not the file's fault: {e}"
        );
        // An empty variable unsets the file's secret.
        let e = from_file(
            "passport.hs256_secret = \"x\"",
            &[("PINBOARD_PASSPORT__HS256_SECRET", "")],
        )
        .unwrap_err();
        assert_eq!(e.key, "passport", "{e}");
    }

    #[test]
    fn ed25519_key_files_must_be_readable() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("key.pem");
        std::fs::write(&pem, "pem").unwrap();
        let file = format!(
            "passport.ed25519_public_keys = [{:?}]",
            pem.display().to_string()
        );
        let config = from_file(&file, &[]).unwrap();
        assert_eq!(
            config.passport.ed25519_public_keys,
            vec![pem.clone().into()]
        );
        assert_eq!(config.passport.hs256_secret, None);

        let missing = dir.path().join("missing.pem");
        let var = [(
            "PINBOARD_PASSPORT__ED25519_PUBLIC_KEYS",
            missing.to_str().unwrap(),
        )];
        let e = from_file(&file, &var).unwrap_err();
        assert_eq!(e.key, "passport.ed25519_public_keys");
        assert!(e.message.contains("missing.pem"), "{e}");
        assert!(
            e.message
                .ends_with("(from PINBOARD_PASSPORT__ED25519_PUBLIC_KEYS)"),
            "{e}"
        );

        let var = [(
            "PINBOARD_PASSPORT__ED25519_PUBLIC_KEYS",
            dir.path().to_str().unwrap(),
        )];
        let e = from_file(&file, &var).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
    }

    #[test]
    fn the_redis_ca_file_must_be_readable() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("redis-ca.pem");
        std::fs::write(&pem, "pem").unwrap();
        let file = format!(
            "redis_url = \"rediss://:pw@redis.internal:6380\"\nredis_ca_file = {:?}",
            pem.display().to_string()
        );
        let config = from_file(&file, &[SECRET]).unwrap();
        assert_eq!(config.redis_ca_file, Some(pem));
        assert!(config.redis_url.tls());
        assert_eq!(
            config.redis_url.masked(),
            "rediss://:***@redis.internal:6380/0"
        );

        let missing = dir.path().join("missing.pem");
        let var = [
            SECRET,
            ("PINBOARD_REDIS_CA_FILE", missing.to_str().unwrap()),
        ];
        let e = from_file(&file, &var).unwrap_err();
        assert_eq!(e.key, "redis_ca_file", "{e}");
        assert!(e.message.contains("cannot read") && e.message.contains("missing.pem"));
        let var = [
            SECRET,
            ("PINBOARD_REDIS_CA_FILE", dir.path().to_str().unwrap()),
        ];
        let e = from_file(&file, &var).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        // A FIFO is refused, not waited on for a writer.
        let fifo = dir.path().join("fifo.pem");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let var = [SECRET, ("PINBOARD_REDIS_CA_FILE", fifo.to_str().unwrap())];
        let e = from_file(&file, &var).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        let var = [SECRET, ("PINBOARD_REDIS_CA_FILE", "")];
        assert_eq!(from_file(&file, &var).unwrap().redis_ca_file, None);
    }

    #[test]
    fn namespaces_table() {
        let good = r#"
            [namespaces."/a"]
            scopes = ["read"]
            [namespaces."/b-c.d"]
            scopes = ["x", "y:z"]
        "#;
        let config = from_file(good, &[SECRET]).unwrap();
        assert_eq!(
            config.namespaces.keys().collect::<Vec<_>>(),
            ["/a", "/b-c.d"]
        );
        assert_eq!(config.namespaces["/b-c.d"].scopes, ["x", "y:z"]);

        let bad: &[(&str, &str, &str)] = &[
            ("namespaces = 1", "namespaces", "expected a table"),
            (
                "namespaces.a.scopes = [\"x\"]",
                "namespaces.a",
                "\"/\" and one path segment",
            ),
            (
                "namespaces.\"/\".scopes = [\"x\"]",
                "namespaces.\"/\"",
                "segment",
            ),
            (
                "namespaces.\"/a/b\".scopes = [\"x\"]",
                "namespaces.\"/a/b\"",
                "segment",
            ),
            (
                "namespaces.\"/a b\".scopes = [\"x\"]",
                "namespaces.\"/a b\"",
                "segment",
            ),
            (
                "namespaces.\"/a\" = [\"x\"]",
                "namespaces.\"/a\"",
                "expected a table",
            ),
            (
                "[namespaces.\"/a\"]",
                "namespaces.\"/a\".scopes",
                "required",
            ),
            (
                "namespaces.\"/a\".scopes = []",
                "namespaces.\"/a\".scopes",
                "non-empty",
            ),
            (
                "namespaces.\"/a\".scopes = \"x\"",
                "namespaces.\"/a\".scopes",
                "array",
            ),
            (
                "namespaces.\"/a\".scopes = [\"\"]",
                "namespaces.\"/a\".scopes",
                "item 1",
            ),
            (
                "namespaces.\"/a\".scopes = [\"x\", \"a b\"]",
                "namespaces.\"/a\".scopes",
                "item 2",
            ),
            (
                "namespaces.\"/a\".scopes = [1]",
                "namespaces.\"/a\".scopes",
                "item 1",
            ),
        ];
        for (file, key, fragment) in bad {
            let e = from_file(file, &[SECRET]).unwrap_err();
            assert_eq!(e.key, *key, "{file}: {e}");
            assert!(e.message.contains(fragment), "{file}: {e}");
        }
    }

    #[test]
    fn render_masks_secrets_and_round_trips() {
        let config = full();
        let text = config.render_masked();
        assert!(!text.contains("pw@"), "{text}");
        assert!(
            !text.contains("file-secret-0123456789abcdef012345"),
            "{text}"
        );
        assert!(
            text.contains("redis_url = \"redis://:***@10.0.0.5:6380/3\""),
            "{text}"
        );
        assert!(text.contains("hs256_secret = \"***\""), "{text}");
        assert!(!text.contains("next-secret"), "{text}");
        // The Redis URL is rendered before the passport section, the secret before the list.
        let unmasked = text
            .replacen("***", "pw", 1)
            .replacen("***", "file-secret-0123456789abcdef012345", 1)
            .replacen("***", "next-secret-0123456789abcdef0123456", 1)
            .replacen("***", "old-secret-0123456789abcdef01234567", 1);
        assert_eq!(from_file(&unmasked, &[]).unwrap(), config);

        let defaults = Config::load(None, env(&[SECRET])).unwrap();
        let unmasked = defaults
            .render_masked()
            .replace("***", "s3cret-0123456789abcdef0123456789");
        assert_eq!(from_file(&unmasked, &[]).unwrap(), defaults);
    }

    #[test]
    fn render_keeps_odd_but_valid_values() {
        let mut config = Config::load(None, env(&[SECRET])).unwrap();
        config.balance_factor = 1.1;
        config.affinity = Affinity::Query("q\"x".into());
        config.passport.issuer = Some("it's \"quoted\" \\ here".into());
        config.redis_url = RedisTarget::parse("redis-cluster://a:7000,[::1]:7001").unwrap();
        config.fleet_epoch = i64::MAX as u64;
        let unmasked = config
            .render_masked()
            .replace("***", "s3cret-0123456789abcdef0123456789");
        assert_eq!(from_file(&unmasked, &[]).unwrap(), config);
    }

    #[test]
    fn affinity_forms() {
        for (text, affinity) in [
            ("ip", Affinity::Ip),
            ("none", Affinity::None),
            (
                "header:X-Session-Id",
                Affinity::Header("x-session-id".into()),
            ),
            ("query:sid", Affinity::Query("sid".into())),
            ("cookie:SID", Affinity::Cookie("SID".into())),
        ] {
            assert_eq!(text.parse::<Affinity>(), Ok(affinity.clone()));
            assert_eq!(
                affinity.to_string().parse::<Affinity>(),
                Ok(affinity),
                "Display parses back"
            );
        }
        for bad in [
            "",
            "ip:x",
            "header",
            "header:",
            "header:a:b",
            "cookie:",
            "query:a=b",
            "Ip",
        ] {
            assert!(bad.parse::<Affinity>().is_err(), "{bad}");
        }
    }

    #[test]
    fn restart_only_keys_exist_and_a_reload_keeps_them() {
        let names: Vec<&str> = keys::KEYS.iter().map(|k| k.name).collect();
        for key in RESTART_ONLY {
            assert!(names.contains(key), "{key} is a key");
        }
        let running = Config::load(None, env(&[SECRET, ("PINBOARD_NODE_ID", "n1")])).unwrap();
        let file = "listen = \"127.0.0.1:9999\"\nshards = 64\n\n[forwards]\ntimeout_ms = 7\n\
                    max_inflight = 3\n\n[namespaces.\"/a\"]\nscopes = [\"r\"]\n";
        let (config, kept) = Config::reload(
            Some((Path::new("/etc/pinboard.toml"), file)),
            env(&[SECRET]),
            &running,
        )
        .unwrap();
        assert_eq!(kept, ["listen", "shards", "forwards.max_inflight"]);
        assert_eq!(config.listen, running.listen);
        assert_eq!(config.shards, running.shards);
        assert_eq!(config.forwards.max_inflight, running.forwards.max_inflight);
        assert_eq!(
            config.node_id, "n1",
            "an unset node_id stays the running one"
        );
        assert_eq!(config.forwards.timeout_ms, 7);
        assert_eq!(
            config.differences(&running),
            ["forwards.timeout_ms", "namespaces"]
        );
        let refused = |file: &str| {
            let path = Path::new("/etc/pinboard.toml");
            Config::reload(Some((path, file)), env(&[SECRET]), &running).unwrap_err()
        };
        // A refused file is refused as at start.
        let e = refused("[forwards]\ntimeout_ms = 0");
        assert_eq!(e.key, "forwards.timeout_ms");
        // Strict mode's WAIT is checked against the redis_timeout_ms the node keeps running.
        let e =
            refused("redis_timeout_ms = 9000\n[redis]\nwait_replicas = 1\nwait_timeout_ms = 5000");
        assert_eq!(e.key, "redis.wait_timeout_ms");
        assert!(e.message.contains("below redis_timeout_ms (2000)"), "{e}");
    }

    #[test]
    fn retiring_keys_take_an_instant_in_either_form() {
        let secret = "next-secret-0123456789abcdef0123456";
        let at = |not_after: &str| {
            from_file(
                &format!(
                    "[passport]\nhs256_secrets = [{{ key = {secret:?}, not_after = {not_after} }}]"
                ),
                &[],
            )
            .map(|c| c.passport.hs256_secrets[0].not_after)
        };
        assert_eq!(at("2027-01-01T00:00:00Z").unwrap(), Some(1_798_761_600));
        assert_eq!(
            at("2027-01-01T02:00:00+02:00").unwrap(),
            Some(1_798_761_600)
        );
        assert_eq!(at("1798761600").unwrap(), Some(1_798_761_600));
        assert_eq!(at("1970-01-01T00:00:00Z").unwrap(), Some(0));
        for bad in [
            "2027-01-01T00:00:00",
            "2027-01-01",
            "-5",
            "\"soon\"",
            "1969-12-31T23:59:59Z",
        ] {
            let e = at(bad).unwrap_err();
            assert_eq!(e.key, "passport.hs256_secrets", "{bad}");
            assert!(e.message.contains("not_after"), "{bad}: {}", e.message);
        }
        for (bad, why) in [
            ("[{ key = \"short\" }]", "at least 32 bytes"),
            ("[{ secret = \"x\" }]", "unknown field"),
            ("[{ not_after = 5 }]", "key: missing"),
            ("[5]", "expected a string or"),
        ] {
            let e = from_file(&format!("[passport]\nhs256_secrets = {bad}"), &[]).unwrap_err();
            assert!(e.message.contains(why), "{bad}: {}", e.message);
        }
        let many = vec![format!("{secret:?}"); 17].join(", ");
        let e = from_file(&format!("[passport]\nhs256_secrets = [{many}]"), &[]).unwrap_err();
        assert!(e.message.contains("at most 16 keys"), "{}", e.message);
        // Only retiring secrets are a Passport key too.
        let only = from_file(&format!("[passport]\nhs256_secrets = [{secret:?}]"), &[]).unwrap();
        assert_eq!(only.passport.hs256_secret, None);
    }
}
