//! `pinned-example`: an echo/counter instance server built on the `pinned` worker library.
//!
//! - `GET  /{ns}/{id}/count`   increments the instance's counter: `{"ns","id","count","epoch","session"}`
//! - `POST /{ns}/{id}/echo`    answers the request body back, with its content type
//! - `POST /{ns}/{id}/release` gives the instance up: `{"released": bool}`
//!
//! A counter lives with its placement: it restarts at 1 when the instance is (re)activated
//! here, and is dropped when the instance is released, evicted or wound down.
//!
//! With `--durable-dir DIR` (a [`FileStore`] there), an instance can also be a ticker, which
//! outlives its placement: it ticks every `--tick-secs` (default 5) by scheduling its own wake.
//! - `POST   /{ns}/{id}/ticker`  starts it (keeping its count if it ran before):
//!   `{"ticks","nextWakeMs"}`
//! - `GET    /{ns}/{id}/ticks`   `{"ticks","nextWakeMs"}` as the store holds them
//! - `DELETE /{ns}/{id}/ticker`  stops it and forgets it: `{"stopped": bool}`
//!
//! Each `_wake` adds one tick: it schedules the next wake, then saves the count (a failure of
//! either fails the hook, and the sweep sends the wake again); the node's durability
//! sweep sends it to whichever worker holds the instance then, placing it first if none does.
//!
//! An instance can also keep a note in the store (its durable state, in place of a ticker's):
//! - `PUT /{ns}/{id}/note[?after_ms=N]`  saves the body, fenced at the request's epoch, after
//!   waiting N ms (at most 60000; a slow save, where a pause can fall): `{"saved":true,
//!   "epoch"}`, or 409 `{"detail":"stale epoch: stored S, offered O"}` when the instance has
//!   been placed elsewhere since, at a later epoch, and the new owner claimed or saved it
//! - `GET /{ns}/{id}/note`  `{"note"}` as the store holds it (`null` when none)
//!
//! Every save (tick or note) is fenced by the placement epoch (`DurabilityStore::save_fenced`):
//! a worker paused past its lease that resumes and saves is refused, and the new owner's state
//! stands.
//!
//! With `--serve-log FILE` it appends one JSON line per instance request it answered (instance,
//! session, epoch, start and end in wall-clock µs, status): what `scripts/chaos`'s ownership
//! checker reads.
//!
//! With `--tls-cert-file` and `--tls-key-file` it serves HTTPS (its advertise URL is then
//! `https://…`); a `--registry https://…` is called over TLS, verified against the system roots
//! plus `--registry-ca-file`.
//!
//! It prints `listening ADDR advertise=URL` once bound and `registered session=ID` on every
//! (re)registration. SIGTERM or SIGINT shuts down gracefully (release, deregister) and exits
//! 0; a second signal exits at once. Superseded by a higher-epoch registration, it shuts down
//! and exits 1; when the registry refused its credential past its lease (an expired token
//! never replaced: give `--token-file` to rotate it without a restart), it exits 4 (as the
//! Python runner does), unless `--retry-refused-credential`. A configuration it cannot start
//! with exits 2.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ahash::RandomState;
use bytes::Bytes;
use clap::Parser;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, StatusCode};
use pinned::{
    App, Config, DriverKind, DurabilityStore, Error, Event, Fence, FencedError, FileStore, Handle,
    Instance, Origin, Request, Response, Takeover, Worker,
};
use serde_json::{Value, json};
use tracing::{info, warn};

const MAX_ECHO: usize = 1024 * 1024;
/// The longest wait a note's save may ask for (`after_ms`).
const MAX_NOTE_DELAY_MS: u64 = 60_000;

#[derive(Parser)]
#[command(
    version,
    about = "Echo/counter instance server on the pinned worker library"
)]
struct Args {
    /// Registry base URL: the node's address plus its base_path (`https://…` for a node that
    /// serves HTTPS).
    #[arg(long, env = "PINNED_REGISTRY")]
    registry: String,
    /// PEM file of CA certificates trusted, besides the system roots, for an https registry.
    #[arg(long, env = "PINNED_REGISTRY_CA_FILE")]
    registry_ca_file: Option<PathBuf>,
    /// Passport credential with the pinboard:worker scope.
    #[arg(
        long,
        env = "PINNED_TOKEN",
        hide_env_values = true,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file holding the credential instead, read again whenever it changes (a rotated
    /// token is used without a restart).
    #[arg(long, env = "PINNED_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Keep retrying when the registry refuses the credential past the lease, rather than
    /// stop and exit 4.
    #[arg(long, env = "PINNED_RETRY_REFUSED_CREDENTIAL")]
    retry_refused_credential: bool,
    #[arg(long, env = "PINNED_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Comma-separated namespaces, each `/segment`.
    #[arg(
        long,
        env = "PINNED_NAMESPACES",
        value_delimiter = ',',
        required = true
    )]
    namespaces: Vec<String>,
    #[arg(long, env = "PINNED_CLIENT_ID", default_value = "pinned-example")]
    client_id: String,
    /// The URL Pinboard reaches this worker at (default: http:// + the bound address, https://
    /// with --tls-cert-file).
    #[arg(long, env = "PINNED_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key-file.
    #[arg(long, env = "PINNED_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The certificate's PEM private key; needs --tls-cert-file.
    #[arg(long, env = "PINNED_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    #[arg(long, env = "PINNED_HEADROOM", default_value_t = 100)]
    headroom: u64,
    #[arg(long, env = "PINNED_THREADS", default_value_t = 1)]
    threads: usize,
    /// Event-loop driver: io_uring where the kernel offers it (auto), or forced.
    #[arg(long, env = "PINNED_DRIVER", default_value = "auto", value_parser = ["auto", "io_uring", "epoll"])]
    driver: String,
    /// Hostname-aware mode: the hostname this worker serves.
    #[arg(long, env = "PINNED_HOSTNAME")]
    hostname: Option<String>,
    #[arg(long, env = "PINNED_ENV")]
    env: Option<String>,
    /// Per-namespace envs, comma-separated `NS=ENV`.
    #[arg(long, env = "PINNED_ENVS", value_delimiter = ',', value_parser = ns_env)]
    envs: Vec<(String, String)>,
    #[arg(long, env = "PINNED_TAKEOVER", value_parser = ["wind_down", "deny"])]
    takeover: Option<String>,
    #[arg(long, env = "PINNED_EPOCH")]
    epoch: Option<u64>,
    /// Instances expected at once: sizes the worker's held map and the counters up front.
    #[arg(long, env = "PINNED_EXPECTED_INSTANCES", default_value_t = 0)]
    expected_instances: usize,
    /// Keep durable instances (tickers) in this directory, and serve `_wake`.
    #[arg(long, env = "PINNED_DURABLE_DIR")]
    durable_dir: Option<PathBuf>,
    /// Seconds between a ticker's ticks.
    #[arg(long, env = "PINNED_TICK_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    tick_secs: u64,
    /// Append one JSON line per instance request the app answered to this file, for an
    /// ownership checker (scripts/chaos): `{"inst","session","epoch","start_us","end_us",
    /// "status","fenced"}`, times in µs of the wall clock; `fenced` when the lease had lapsed
    /// by the answer, which the library then withholds.
    #[arg(long, env = "PINNED_SERVE_LOG")]
    serve_log: Option<PathBuf>,
}

fn ns_env(pair: &str) -> Result<(String, String), String> {
    let (ns, env) = pair
        .split_once('=')
        .ok_or_else(|| format!("{pair:?} is not NS=ENV"))?;
    Ok((ns.to_owned(), env.to_owned()))
}

impl Args {
    fn config(self) -> std::io::Result<Config> {
        let namespaces: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
        let token = self.token.as_deref().unwrap_or_default();
        let mut config = Config::new(&self.registry, token, &self.client_id, &namespaces);
        config.token_file = self.token_file;
        config.registration.stop_on_refused_credential = !self.retry_refused_credential;
        config.listen = self.listen;
        config.advertise_url = self.advertise_url;
        config.registry_ca_file = self.registry_ca_file;
        config.tls_cert_file = self.tls_cert_file;
        config.tls_key_file = self.tls_key_file;
        config.headroom = self.headroom;
        config.threads = self.threads;
        config.driver = match self.driver.as_str() {
            "io_uring" => DriverKind::IoUring,
            "epoll" => DriverKind::Epoll,
            _ => DriverKind::Auto,
        };
        config.registration.hostname = self.hostname;
        config.registration.env = self.env;
        config.registration.envs = self.envs.into_iter().collect::<BTreeMap<_, _>>();
        config.registration.takeover = self.takeover.map(|t| match t.as_str() {
            "deny" => Takeover::Deny,
            _ => Takeover::WindDown,
        });
        config.registration.epoch = self.epoch;
        config.expected_instances = self.expected_instances;
        if let Some(dir) = self.durable_dir {
            config.durability = Some(Arc::new(FileStore::open(dir)?));
        }
        Ok(config)
    }
}

/// Why `main` stops the worker.
enum Stop {
    Signal,
    /// A higher-epoch registration displaced it.
    Superseded,
    /// The registry refused its credential past the lease.
    CredentialRefused,
}

/// Shards of the counters: as the library splits its held instances (`src/held.rs`), so that
/// a growing map stalls only the requests to its own share of the instances.
const SHARDS: usize = 64;

type Counts = HashMap<(String, String), u64, RandomState>;

struct Counters {
    /// Picks an instance's shard; seeded apart from the shards' own maps.
    router: RandomState,
    shards: Vec<Mutex<Counts>>,
    stop: Sender<Stop>,
    /// A ticker's period.
    tick: Duration,
    /// Where each answered request is journaled (`--serve-log`).
    journal: Option<Mutex<File>>,
}

impl Counters {
    fn new(expected: usize, stop: Sender<Stop>, tick: Duration, journal: Option<File>) -> Counters {
        let per_shard = expected.div_ceil(SHARDS);
        let per_shard = per_shard + per_shard / 8;
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(HashMap::with_capacity_and_hasher(
                    per_shard,
                    RandomState::new(),
                ))
            })
            .collect();
        Counters {
            router: RandomState::new(),
            shards,
            stop,
            tick,
            journal: journal.map(Mutex::new),
        }
    }

    fn counts(&self, ns: &str, id: &str) -> MutexGuard<'_, Counts> {
        let shard = self.router.hash_one((ns, id)) as usize % SHARDS;
        self.shards[shard].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, ns: &str, id: &str) {
        self.counts(ns, id).remove(&(ns.to_owned(), id.to_owned()));
    }

    /// The ticker routes, `None` for any other path or without a store.
    async fn ticker(
        &self,
        worker: &Handle,
        instance: &Instance,
        method: &Method,
    ) -> Option<Result<Value, String>> {
        let store = worker.store()?;
        let (ns, id) = (instance.ns.as_str(), instance.id.as_str());
        let ticks = || -> Result<Option<u64>, String> {
            let state = store.load(ns, id).map_err(|e| e.to_string())?;
            Ok(state.as_deref().and_then(read_ticks))
        };
        let answer = match (method.clone(), instance.rest.as_str()) {
            (Method::GET, "/ticks") => ticks().and_then(|ticks| {
                let next = store.scheduled(ns, id).map_err(|e| e.to_string())?;
                Ok(json!({ "ticks": ticks, "nextWakeMs": next }))
            }),
            (Method::POST, "/ticker") => match ticks() {
                Ok(ticks) => self.tick(worker, instance, ticks.unwrap_or(0)).await,
                Err(e) => Err(e),
            },
            (Method::DELETE, "/ticker") => {
                let stopped = ticks().map(|t| t.is_some());
                let cancelled = worker.cancel_wake(ns, id).await.map_err(|e| e.to_string());
                let removed = store.remove(ns, id).map_err(|e| e.to_string());
                removed
                    .and(cancelled)
                    .and(stopped)
                    .map(|stopped| json!({ "stopped": stopped }))
            }
            _ => return None,
        };
        Some(answer)
    }

    /// The note routes: `PUT` saves the body fenced at the request's epoch (after `after_ms`),
    /// `GET` reads it.
    async fn note(
        &self,
        store: &dyn DurabilityStore,
        instance: &Instance,
        req: &mut Request<'_>,
    ) -> Response {
        let (ns, id) = (instance.ns.as_str(), instance.id.as_str());
        let answer = |status, body: Value| Response::json_value(status, &body);
        match req.method().clone() {
            Method::GET => match store.load(ns, id) {
                Ok(note) => {
                    let note = note.map(|n| String::from_utf8_lossy(&n).into_owned());
                    answer(StatusCode::OK, json!({ "note": note }))
                }
                Err(e) => answer(StatusCode::BAD_GATEWAY, json!({ "detail": e.to_string() })),
            },
            Method::PUT => {
                let Some(after_ms) = note_delay(req.head.uri.query()) else {
                    let detail = format!("after_ms: expected 0-{MAX_NOTE_DELAY_MS}");
                    return answer(StatusCode::BAD_REQUEST, json!({ "detail": detail }));
                };
                let note = match req.read_body(MAX_ECHO).await {
                    Ok(body) => body,
                    Err(e) => {
                        let detail = json!({ "detail": e.to_string() });
                        return answer(StatusCode::PAYLOAD_TOO_LARGE, detail).closing();
                    }
                };
                let epoch = instance.epoch.as_str();
                info!(%ns, %id, %epoch, after_ms, "note saving");
                monoio::time::sleep(Duration::from_millis(after_ms)).await;
                match store.save_fenced(ns, id, &Fence::from(instance), &note) {
                    Ok(()) => {
                        info!(%ns, %id, %epoch, "note saved");
                        answer(StatusCode::OK, json!({ "saved": true, "epoch": epoch }))
                    }
                    Err(FencedError::Stale(stale)) => {
                        warn!(%ns, %id, %stale, "note refused");
                        answer(StatusCode::CONFLICT, json!({ "detail": stale.to_string() }))
                    }
                    Err(FencedError::Store(e)) => {
                        answer(StatusCode::BAD_GATEWAY, json!({ "detail": e.to_string() }))
                    }
                }
            }
            _ => answer(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({ "detail": "method not allowed" }),
            )
            .header(http::header::ALLOW, HeaderValue::from_static("GET, PUT")),
        }
    }

    /// The example's own routes: the ticker's and the note's, then the counter's and echo's.
    async fn answer(
        &self,
        worker: &Handle,
        instance: &Instance,
        req: &mut Request<'_>,
    ) -> Result<Response, Error> {
        let (ns, id) = (instance.ns.as_str(), instance.id.as_str());
        if let Some(store) = worker.store()
            && instance.rest == "/note"
        {
            return Ok(self.note(store.as_ref(), instance, req).await);
        }
        match self.ticker(worker, instance, req.method()).await {
            Some(Ok(answer)) => return Ok(Response::json_value(StatusCode::OK, &answer)),
            Some(Err(detail)) => {
                let detail = json!({ "detail": detail });
                return Ok(Response::json_value(StatusCode::BAD_GATEWAY, &detail));
            }
            None => {}
        }
        match (req.method().clone(), instance.rest.as_str()) {
            (Method::GET, "/count") => {
                let count = {
                    let mut counts = self.counts(ns, id);
                    let count = counts.entry((ns.to_owned(), id.to_owned())).or_default();
                    if instance.activated {
                        *count = 0;
                    }
                    *count += 1;
                    *count
                };
                Ok(Response::json_value(
                    StatusCode::OK,
                    &json!({
                        "ns": ns, "id": id, "count": count,
                        "epoch": instance.epoch.as_str(), "session": worker.session_id(),
                    }),
                ))
            }
            (Method::POST, "/echo") => {
                let content_type = req
                    .header(CONTENT_TYPE)
                    .cloned()
                    .unwrap_or(HeaderValue::from_static("application/octet-stream"));
                match req.read_body(MAX_ECHO).await {
                    Ok(body) => Ok(Response::new(StatusCode::OK, None, body.freeze())
                        .header(CONTENT_TYPE, content_type)),
                    Err(e) => Ok(Response::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        Some("text/plain; charset=utf-8"),
                        Bytes::from(e.to_string()),
                    )
                    .closing()),
                }
            }
            (Method::POST, "/release") => {
                self.forget(ns, id);
                match worker.release(ns, id).await {
                    Ok(released) => Ok(Response::json_value(
                        StatusCode::OK,
                        &json!({ "released": released }),
                    )),
                    Err(e) => Ok(Response::json_value(
                        StatusCode::BAD_GATEWAY,
                        &json!({ "detail": e.to_string() }),
                    )),
                }
            }
            _ => Ok(Response::json_value(
                StatusCode::NOT_FOUND,
                &json!({ "detail": "not found" }),
            )),
        }
    }

    /// Schedules the next tick, then saves `ticks` fenced at the instance's epoch. In that
    /// order a failure of either leaves the wake to be sent again (the hook fails) without a
    /// tick counted twice: a failed schedule saved nothing, a failed save counts the tick at
    /// the next wake (on this worker, or on the later owner that refused it).
    async fn tick(
        &self,
        worker: &Handle,
        instance: &Instance,
        ticks: u64,
    ) -> Result<Value, String> {
        let (ns, id) = (instance.ns.as_str(), instance.id.as_str());
        let store = worker.store().ok_or("no durability store")?;
        let next = SystemTime::now() + self.tick;
        worker
            .schedule_wake(ns, id, next)
            .await
            .map_err(|e| format!("scheduling the next tick: {e}"))?;
        let state = json!({ "ticks": ticks }).to_string();
        store
            .save_fenced(ns, id, &Fence::from(instance), state.as_bytes())
            .map_err(|e| e.to_string())?;
        let next_ms = next
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Ok(json!({ "ticks": ticks, "nextWakeMs": next_ms }))
    }
}

/// A note's `after_ms` from the query (0 without one); `None` when it is not a number up to
/// [`MAX_NOTE_DELAY_MS`].
fn note_delay(query: Option<&str>) -> Option<u64> {
    let value = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("after_ms="));
    match value {
        None => Some(0),
        Some(ms) => ms.parse().ok().filter(|&ms| ms <= MAX_NOTE_DELAY_MS),
    }
}

/// A ticker's count from its saved state (`{"ticks": n}`).
fn read_ticks(state: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Value>(state).ok()?["ticks"].as_u64()
}

/// Microseconds of the wall clock: one clock for every worker of the host, so that a checker
/// can order what two workers served.
fn wall_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

impl App for Counters {
    async fn handle(
        &self,
        worker: &Handle,
        instance: &Instance,
        req: &mut Request<'_>,
    ) -> Result<Response, Error> {
        let Some(journal) = &self.journal else {
            return self.answer(worker, instance, req).await;
        };
        let start_us = wall_us();
        let answer = self.answer(worker, instance, req).await;
        // Past the lease the library withholds this answer (it refuses instead): not served.
        let fenced = !worker.status().lease_healthy;
        let line = json!({
            "inst": format!("{}/{}", instance.ns, instance.id),
            "session": worker.session_id(),
            "epoch": instance.epoch.as_str(),
            "start_us": start_us as u64,
            "end_us": wall_us() as u64,
            "status": answer.as_ref().map_or(500, |r| r.status.as_u16()),
            "fenced": fenced,
        });
        let mut file = journal.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = writeln!(file, "{line}") {
            warn!(error = %e, "--serve-log: cannot write");
        }
        answer
    }

    /// A ticker's wake: one more tick, saved, and the next one scheduled. A wake for an
    /// instance with no saved ticker (stopped meanwhile) does nothing.
    async fn on_wake(
        &self,
        worker: &Handle,
        instance: &Instance,
        state: Option<Vec<u8>>,
    ) -> Result<(), Error> {
        let (ns, id) = (instance.ns.as_str(), instance.id.as_str());
        let Some(ticks) = state.as_deref().and_then(read_ticks) else {
            return Ok(());
        };
        match self.tick(worker, instance, ticks + 1).await {
            Ok(_) => {
                info!(%ns, %id, ticks = ticks + 1, "tick");
                Ok(())
            }
            // The wake stays on the schedule: the sweep sends it again at its next pass.
            Err(e) => {
                warn!(%ns, %id, error = %e, "tick");
                Err(Error::new(Origin::Internal, e))
            }
        }
    }

    async fn on_event(&self, worker: &Handle, event: Event) {
        match event {
            Event::Registered { session_id, .. } => println!("registered session={session_id}"),
            Event::WindDown(message) => match message.deadline {
                // A counter has nothing to hand over: release at once rather than at the
                // deadline.
                Some(_) => {
                    self.forget(&message.ns, &message.id);
                    if let Err(e) = worker.release(&message.ns, &message.id).await {
                        warn!(ns = %message.ns, id = %message.id, error = %e, "release failed");
                    }
                }
                None => info!(ns = %message.ns, id = %message.id, "wind-down revoked"),
            },
            Event::Evicted { ns, id } => self.forget(&ns, &id),
            Event::Drain { draining, deadline } => info!(draining, ?deadline, "drain"),
            Event::Superseded { error } => {
                warn!(%error, "superseded; shutting down");
                let _ = self.stop.send(Stop::Superseded);
            }
            // The library logged why; a supervisor sees the exit status.
            Event::CredentialRefused { .. } => {
                let _ = self.stop.send(Stop::CredentialRefused);
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PINNED_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file stays plain text, as the node's does.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let (stop, stopped) = channel();
    if let Err(e) = watch_signals(stop.clone()) {
        eprintln!("pinned-example: cannot install signal handlers: {e}");
        return ExitCode::from(2);
    }
    let tick = Duration::from_secs(args.tick_secs);
    let journal = match &args.serve_log {
        Some(path) => match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(file),
            Err(e) => {
                eprintln!("pinned-example: --serve-log {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let counters = Counters::new(args.expected_instances, stop, tick, journal);
    let config = match args.config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("pinned-example: --durable-dir: {e}");
            return ExitCode::from(2);
        }
    };
    let worker = match Worker::start(config, counters) {
        Ok(worker) => worker,
        Err(e) => {
            eprintln!("pinned-example: {e}");
            return ExitCode::from(2);
        }
    };
    let handle = worker.handle();
    println!(
        "listening {} advertise={}",
        handle.local_addr(),
        handle.advertise_url()
    );
    // Every sender lives as long as the process (the signal thread, the worker's app).
    let why = stopped.recv().unwrap_or(Stop::Signal);
    worker.shutdown();
    match why {
        Stop::Signal => ExitCode::SUCCESS,
        Stop::Superseded => ExitCode::from(1),
        // As the Python runner's EXIT_CREDENTIAL_REFUSED.
        Stop::CredentialRefused => ExitCode::from(4),
    }
}

/// The first SIGTERM/SIGINT asks `main` to shut down gracefully; a second exits at once.
fn watch_signals(stop: Sender<Stop>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first = true;
            for signal in signals.forever() {
                if !first {
                    warn!(signal, "second stop signal: exiting now");
                    std::process::exit(1);
                }
                first = false;
                info!(signal, "stop signal: releasing instances and deregistering");
                let _ = stop.send(Stop::Signal);
            }
        })?;
    Ok(())
}
