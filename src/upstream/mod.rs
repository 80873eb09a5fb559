//! This core's upstream state: the workers it forwards to (address, keyed HMAC state, the
//! node-wide inflight count), its keep-alive pool, the workers it ejected, and reusable
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

use crate::attestation::Signer;
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
    inflight: Arc<AtomicU32>,
}

/// Forwards in flight per worker session across all of the node's cores: `forwards.max_inflight`
/// bounds what one node sends one worker, whichever core a client lands on. Each core looks its
/// counter up here once per session (the lock is off the request path); a forward then costs one
/// atomic increment and one decrement.
#[derive(Default)]
pub struct InflightCounters {
    by_session: Mutex<AHashMap<String, Weak<AtomicU32>>>,
}

impl InflightCounters {
    fn of(&self, session: &str) -> Arc<AtomicU32> {
        let mut counters = self.by_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counter) = counters.get(session).and_then(Weak::upgrade) {
            return counter;
        }
        // Counters no core holds any more are dropped now and then, not per lookup.
        if counters.len() >= 1024 && counters.len().is_power_of_two() {
            counters.retain(|_, c| c.strong_count() > 0);
        }
        let counter = Arc::new(AtomicU32::new(0));
        counters.insert(session.to_owned(), Arc::downgrade(&counter));
        counter
    }
}

/// This core's upstream state. Only this core touches it.
pub struct Upstreams {
    pub pool: Pool,
    workers: RefCell<AHashMap<String, Rc<Worker>>>,
    counters: Arc<InflightCounters>,
    ejected: RefCell<AHashMap<String, Instant>>,
    /// In-flight forwards per worker, node-wide (`forwards.max_inflight`).
    pub cap: u32,
    /// Buffers of finished forwards, reused by the next ones instead of allocated again.
    pub spare: RefCell<Vec<Buffers>>,
}

/// What one forward writes into: the attestation's claims and token, the request head.
#[derive(Default)]
pub struct Buffers {
    pub claims: Vec<u8>,
    pub token: Vec<u8>,
    pub head: BytesMut,
}

impl Upstreams {
    pub fn new(max_inflight: u32, counters: Arc<InflightCounters>) -> Upstreams {
        Upstreams {
            pool: Pool::default(),
            workers: RefCell::default(),
            counters,
            ejected: RefCell::default(),
            cap: max_inflight,
            spare: RefCell::default(),
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
            inflight: self.counters.of(session_id),
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
        if worker.inflight.fetch_add(1, Ordering::AcqRel) >= cap {
            worker.inflight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Inflight(&worker.inflight))
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
