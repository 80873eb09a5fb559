//! The public face of a running worker: [`Worker`] starts and stops it, [`Handle`] is what the
//! application (and tests) use while it runs — its session and held instances, releasing and
//! tagging them, adjusting headroom and the draining flag.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pinboard::http::WorkerAddr;
use serde_json::{Value, json};

use crate::app::{App, Message};
use crate::config::Config;
use crate::epoch::Epoch;
use crate::registry::{CallError, Registry};
use crate::runtime::{bind, choose_driver, spawn_control, spawn_serving};
use crate::state::Shared;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid worker configuration: {0}")]
    Config(String),
    #[error("cannot start the worker: {0}")]
    Io(#[from] std::io::Error),
}

/// A running worker. [`shutdown`](Worker::shutdown) stops it gracefully; dropping it stops it
/// at once, without releasing or deregistering (the registry then lets the lease lapse).
pub struct Worker {
    handle: Handle,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Binds the listener, then starts the serving threads and the control thread, which
    /// registers in the background. Returns once the listener is bound, so Pinboard's probe
    /// of the first registration finds it.
    pub fn start<A: App>(config: Config, app: A) -> Result<Worker, StartError> {
        let registry = config.validate().map_err(StartError::Config)?;
        let driver = choose_driver(config.driver).map_err(StartError::Config)?;
        let listeners = bind(config.listen, config.threads)?;
        let local_addr = listeners[0].local_addr()?;
        let advertise_url = config
            .advertise_url
            .clone()
            .unwrap_or_else(|| default_advertise_url(local_addr));
        let base = WorkerAddr::parse(&advertise_url)
            .map_err(|rule| StartError::Config(rule.to_owned()))?
            .base;
        let registry = Registry::new(registry, &config.token, config.call_timeout);
        let shared = Arc::new(Shared::new(
            config,
            registry,
            advertise_url,
            base,
            local_addr,
            driver,
        ));
        let app = Arc::new(app);
        // On a failure, the threads already started end with the serving stop.
        let spawned = spawn_serving(&shared, &app, listeners).and_then(|mut threads| {
            threads.push(spawn_control(&shared, &app)?);
            Ok(threads)
        });
        let threads = spawned.inspect_err(|_| shared.serving_stop.fire())?;
        Ok(Worker {
            handle: Handle::new(shared),
            threads,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops gracefully: refuses new activations, releases every held instance, deregisters
    /// (each call given up after three tries), then closes the listener and lets in-flight
    /// requests finish within the configured grace. Returns once every thread has ended.
    pub fn shutdown(mut self) {
        self.stop(true);
    }

    fn stop(&mut self, graceful: bool) {
        let shared = &self.handle.shared;
        if !shared.stop.is_fired() {
            shared.graceful.store(graceful, Ordering::SeqCst);
            shared.stop.fire();
        }
        for thread in self.threads.drain(..) {
            // A panicking thread has already reported itself through the panic hook.
            let _ = thread.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// `http://` + the bound address, with loopback in place of an unspecified address (which
/// Pinboard could not connect to).
fn default_advertise_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// An instance this worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub ns: String,
    pub id: String,
    pub epoch: Epoch,
}

/// The worker's standing with the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub session_id: Option<String>,
    /// The lease is known to be live: renewed less than a lease TTL ago.
    pub lease_healthy: bool,
    /// This worker's own draining flag.
    pub draining: bool,
    /// The registry's view: the own flag or an operator's drain.
    pub registry_draining: bool,
    pub drain_deadline: Option<Duration>,
    pub degraded: bool,
    pub superseded: bool,
    pub headroom: u64,
}

/// Access to a running worker; cheap to clone and usable from any thread. The async calls
/// need a monoio event loop with timers (any of the worker's own threads has one).
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    pub(crate) fn new(shared: Arc<Shared>) -> Handle {
        Handle { shared }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    pub fn advertise_url(&self) -> &str {
        &self.shared.advertise_url
    }

    /// The secret registered with Pinboard: it signs attestations for this worker with it.
    pub fn secret(&self) -> &str {
        &self.shared.secret
    }

    pub fn session_id(&self) -> Option<String> {
        self.shared.state().session.clone()
    }

    pub fn status(&self) -> Status {
        let state = self.shared.state();
        Status {
            session_id: state.session.clone(),
            lease_healthy: state.lease_healthy(Instant::now()),
            draining: state.draining,
            registry_draining: state.registry_draining,
            drain_deadline: state.drain_deadline,
            degraded: state.degraded,
            superseded: state.superseded,
            headroom: state.headroom,
        }
    }

    /// Held instances, sorted by namespace and id.
    pub fn held(&self) -> Vec<Held> {
        self.shared
            .state()
            .held()
            .into_iter()
            .map(|(ns, id, epoch)| Held { ns, id, epoch })
            .collect()
    }

    /// Wind-down messages received, oldest first (the last 1024).
    pub fn messages(&self) -> Vec<Message> {
        self.shared.state().messages.iter().cloned().collect()
    }

    /// The headroom sent on the next heartbeat.
    pub fn set_headroom(&self, headroom: u64) {
        self.shared.state().headroom = headroom;
    }

    /// This worker's own draining flag, sent on the next heartbeat: while set, the registry
    /// places no new instances here.
    pub fn set_draining(&self, draining: bool) {
        self.shared.state().draining = draining;
    }

    /// Gives up `(ns, id)`: the worker stops holding it at once, then asks the registry to
    /// free its placement, quoting the epoch it was held at (given up after three tries).
    /// Whether the registry freed a row.
    pub async fn release(&self, ns: &str, id: &str) -> Result<bool, CallError> {
        let (session, epoch) = {
            let mut state = self.shared.state();
            let epoch = state
                .forget(ns, id, Instant::now())
                .ok_or_else(|| not_held(ns, id))?;
            (state.session.clone().ok_or(CallError::NoSession)?, epoch)
        };
        let body = json!([{
            "sessionId": session, "namespace": ns, "id": id, "epoch": epoch.as_str(),
        }]);
        let answer = self.shared.registry.post_thrice("release", &body).await?;
        let released = answer.get("released").and_then(Value::as_u64);
        Ok(released.ok_or(CallError::BadAnswer { status: 200 })? > 0)
    }

    /// Sets the owner tag of the held `(ns, id)` (1–256 characters). Whether the registry
    /// wrote it: false when the placement moved on meanwhile.
    pub async fn tag(&self, ns: &str, id: &str, tag: &str) -> Result<bool, CallError> {
        let (session, epoch) = {
            let state = self.shared.state();
            let epoch = state
                .epoch_of(ns, id)
                .cloned()
                .ok_or_else(|| not_held(ns, id))?;
            (state.session.clone().ok_or(CallError::NoSession)?, epoch)
        };
        let body = json!({
            "sessionId": session, "namespace": ns, "id": id, "epoch": epoch.as_str(), "tag": tag,
        });
        let answer = self.shared.registry.post_thrice("tag", &body).await?;
        answer
            .get("tagged")
            .and_then(Value::as_bool)
            .ok_or(CallError::BadAnswer { status: 200 })
    }
}

fn not_held(ns: &str, id: &str) -> CallError {
    CallError::NotHeld {
        ns: ns.to_owned(),
        id: id.to_owned(),
    }
}
