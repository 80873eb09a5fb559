//! This core's upstream state: the workers it forwards to (address, keyed HMAC state, the
//! node-wide inflight gauge), its keep-alive pool, the workers it ejected, and reusable
//! buffers. Only this core touches it; the data plane ([`crate::proxy`]) reads and fills it.

mod pool;

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use bytes::BytesMut;

pub use pool::{Pool, Upstream, connect};

use crate::attestation::{Recent, Signer};
use crate::http::WorkerAddr;
use crate::placement::Placement;

/// How long a worker that could not be reached stays ejected from new placements (used only
/// when no other candidate remains).
const EJECTION: Duration = Duration::from_secs(10);

/// A worker as this core reaches it: its parsed address, its secret's keyed HMAC state, and
/// the node-wide count of forwards in flight to it.
pub struct Worker {
    pub url: String,
    secret: String,
    pub addr: WorkerAddr,
    pub signer: Signer,
    inflight: Arc<Gauge>,
}

/// Node-wide gauges of the workers this node forwards to, across all of its cores: forwards in
/// flight per worker session (`forwards.max_inflight` bounds what one node sends one worker,
/// whichever core a client lands on) and idle pooled connections per advertise URL. Each core
/// looks a gauge up here once per session or address (the lock is off the request path); a
/// forward then costs one atomic increment and one decrement. An entry lives while a core holds
/// its gauge, so `/metrics` lists the workers this node still talks to, no more.
#[derive(Default)]
pub struct WorkerGauges {
    inflight: Mutex<AHashMap<String, Weak<Gauge>>>,
    idle: Mutex<AHashMap<String, Weak<Gauge>>>,
}

/// One worker's gauge, with the advertise URL it is reported under.
pub struct Gauge {
    pub url: String,
    pub value: AtomicU32,
}

impl WorkerGauges {
    fn inflight_of(&self, session: &str, url: &str) -> Arc<Gauge> {
        gauge_of(&self.inflight, session, url)
    }

    fn idle_of(&self, url: &str) -> Arc<Gauge> {
        gauge_of(&self.idle, url, url)
    }

    /// Forwards in flight from this node to the worker of `session` now (0 when no core
    /// holds its gauge).
    pub fn inflight(&self, session: &str) -> u64 {
        let map = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        map.get(session)
            .and_then(Weak::upgrade)
            .map_or(0, |g| u64::from(g.value.load(Ordering::Relaxed)))
    }

    /// Forwards in flight and idle pooled connections, summed per advertise URL (a worker
    /// that registered again under a new session, at the same URL, is one line).
    pub fn by_worker(&self) -> Vec<(String, u64, u64)> {
        let mut by_url: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for (map, inflight) in [(&self.inflight, true), (&self.idle, false)] {
            let map = map.lock().unwrap_or_else(|e| e.into_inner());
            for gauge in map.values().filter_map(Weak::upgrade) {
                let n = u64::from(gauge.value.load(Ordering::Relaxed));
                let entry = by_url.entry(gauge.url.clone()).or_default();
                if inflight {
                    entry.0 += n;
                } else {
                    entry.1 += n;
                }
            }
        }
        by_url
            .into_iter()
            .map(|(url, (a, b))| (url, a, b))
            .collect()
    }
}

fn gauge_of(map: &Mutex<AHashMap<String, Weak<Gauge>>>, key: &str, url: &str) -> Arc<Gauge> {
    let mut gauges = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gauge) = gauges.get(key).and_then(Weak::upgrade) {
        return gauge;
    }
    // Gauges no core holds any more are dropped now and then, not per lookup.
    if gauges.len() >= 1024 && gauges.len().is_power_of_two() {
        gauges.retain(|_, g| g.strong_count() > 0);
    }
    let gauge = Arc::new(Gauge {
        url: url.to_owned(),
        value: AtomicU32::new(0),
    });
    gauges.insert(key.to_owned(), Arc::downgrade(&gauge));
    gauge
}

/// This core's upstream state. Only this core touches it.
pub struct Upstreams {
    pub pool: Pool,
    workers: RefCell<AHashMap<String, Rc<Worker>>>,
    gauges: Arc<WorkerGauges>,
    ejected: RefCell<AHashMap<String, Instant>>,
    /// In-flight forwards per worker, node-wide (`forwards.max_inflight`).
    pub cap: u32,
    /// Buffers of finished forwards, reused by the next ones instead of allocated again.
    pub spare: RefCell<Vec<Buffers>>,
    /// The forward tokens signed this second, reused by the next forwards of their instance.
    pub attestations: RefCell<Recent>,
}

/// What one forward writes into: the attestation's claims and token, the request head.
#[derive(Default)]
pub struct Buffers {
    pub claims: Vec<u8>,
    pub token: Vec<u8>,
    pub head: BytesMut,
}

impl Upstreams {
    pub fn new(max_inflight: u32, idle_timeout: Duration, gauges: Arc<WorkerGauges>) -> Upstreams {
        Upstreams {
            pool: Pool::new(idle_timeout, gauges.clone()),
            workers: RefCell::default(),
            gauges,
            ejected: RefCell::default(),
            cap: max_inflight,
            spare: RefCell::default(),
            attestations: RefCell::default(),
        }
    }

    /// The worker of `placement`, when this core knows how to reach it: a new placement names
    /// it (and is remembered), an existing row's owner is looked up by session. The parsed
    /// address and HMAC state are derived once per session (its URL and secret never change),
    /// not per request.
    pub fn worker(&self, placement: &Placement) -> Known {
        match &placement.worker {
            Some(addr) => self.learn(&placement.session_id, &addr.advertise_url, &addr.secret),
            None => match self.workers.borrow().get(&*placement.session_id) {
                Some(w) => Known::Worker(w.clone()),
                None => Known::Unknown,
            },
        }
    }

    /// Remembers how the session's worker is reached.
    pub fn learn(&self, session_id: &str, url: &str, secret: &str) -> Known {
        if let Some(w) = self.workers.borrow().get(session_id)
            && w.url == url
            && w.secret == secret
        {
            return Known::Worker(w.clone());
        }
        let Ok(addr) = WorkerAddr::parse(url) else {
            return Known::Unreachable;
        };
        let worker = Rc::new(Worker {
            url: url.to_owned(),
            secret: secret.to_owned(),
            addr,
            signer: Signer::new(secret.as_bytes()),
            inflight: self.gauges.inflight_of(session_id, url),
        });
        let mut workers = self.workers.borrow_mut();
        if workers.len() > 10_000 {
            workers.clear();
        }
        workers.insert(session_id.to_owned(), worker.clone());
        Known::Worker(worker)
    }

    /// Sessions this core could not reach lately, as the JSON list `resolve.lua` takes.
    pub fn ejected_json(&self) -> Cow<'static, str> {
        let mut ejected = self.ejected.borrow_mut();
        ejected.retain(|_, since| since.elapsed() < EJECTION);
        if ejected.is_empty() {
            return Cow::Borrowed("[]");
        }
        Cow::Owned(
            serde_json::to_string(&ejected.keys().collect::<Vec<_>>()).expect("strings serialize"),
        )
    }

    pub fn eject(&self, session: &str) {
        self.ejected
            .borrow_mut()
            .insert(session.to_owned(), Instant::now());
    }
}

/// What this core knows of a placement's worker.
pub enum Known {
    Worker(Rc<Worker>),
    /// A session this core has not met: its copy says how to reach it.
    Unknown,
    /// An advertise URL that does not parse (the field rules make this unreachable).
    Unreachable,
}

/// Counts a forward in flight to one worker; refused past the cap.
pub struct Inflight<'a>(&'a AtomicU32);

impl<'a> Inflight<'a> {
    pub fn enter(worker: &'a Worker, cap: u32) -> Option<Inflight<'a>> {
        let inflight = &worker.inflight.value;
        if inflight.fetch_add(1, Ordering::AcqRel) >= cap {
            inflight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Inflight(inflight))
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
