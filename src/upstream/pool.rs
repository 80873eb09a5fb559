//! This core's keep-alive connections to workers.
//!
//! Written here rather than taken from `monoio-http-client`, whose pool puts broken connections
//! back and buffers whole bodies. A connection comes back only after a response that was read
//! to its end on an HTTP/1.1 keep-alive exchange; anything else is dropped.
//!
//! No connection is reused stale. Each is kept idle for at most
//! `forwards.upstream_idle_timeout_ms` (default 4 s: below the 5 s after which uvicorn, Node and
//! many worker servers close an idle connection), or less when its worker announced a shorter
//! `Keep-Alive: timeout=N` (then N - 1 s: the worker's clock started when it wrote its answer,
//! before it was read here). A connection that is taken is checked first
//! ([`Transport::is_stale`]): one the worker closed, or that holds bytes nobody asked for, is
//! dropped and the next one tried. An expired connection is dropped when it is next taken, or
//! at the sweep of the whole pool that a take or a put runs every [`SWEEP_EVERY`], which is
//! what closes the connections to a worker that nothing is sent to any more (stopped,
//! deregistered, or moved).
//!
//! A connection to an `https` worker is kept and reused the same way, its TLS session with it:
//! a reuse costs no handshake. The key is the whole advertise URL, scheme included, so a plain
//! and a TLS connection to one host and port are never mistaken for each other.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ahash::AHashMap;
use bytes::BytesMut;

use super::{Gauge, WorkerGauges};
use crate::http::tls::ClientTls;
use crate::http::{Transport, WorkerAddr};
use crate::metrics::{CoreCounters, PoolDrop};

/// Idle connections kept per worker address.
const MAX_IDLE: usize = 64;
/// How often a take or a put also drops every idle connection past its expiry, whatever its
/// worker, and forgets the addresses left with none.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Taken off a worker's announced `Keep-Alive: timeout`: the worker's idle clock started when it
/// wrote its answer, before this node read it to its end.
const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);

pub struct Upstream {
    /// Plain TCP, or TLS over it for an `https` worker.
    pub stream: Transport,
    /// Bytes read from the worker and not yet consumed.
    pub buf: BytesMut,
    /// Whether this connection already carried a request (a failure on it may be a stale
    /// keep-alive rather than a dead worker).
    pub reused: bool,
    /// The `timeout` of the worker's last `Keep-Alive` header: how long it keeps this
    /// connection open idle.
    pub keep_alive: Option<Duration>,
}

/// One address's idle connections, each with the instant it expires, and the node-wide gauge
/// of how many there are.
struct Idle {
    conns: Vec<(Upstream, Instant)>,
    gauge: Arc<Gauge>,
}

impl Idle {
    fn pop(&mut self) -> Option<(Upstream, Instant)> {
        let popped = self.conns.pop();
        if popped.is_some() {
            self.gauge.value.fetch_sub(1, Ordering::Relaxed);
        }
        popped
    }

    fn drop_expired(&mut self, now: Instant) {
        let before = self.conns.len();
        self.conns.retain(|(_, expires)| now < *expires);
        let dropped = before - self.conns.len();
        self.gauge
            .value
            .fetch_sub(dropped as u32, Ordering::Relaxed);
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let left = self.conns.len() as u32;
        self.gauge.value.fetch_sub(left, Ordering::Relaxed);
    }
}

/// Idle connections by advertise URL (borrowed for lookups: nothing allocated per request).
pub struct Pool {
    idle: RefCell<AHashMap<String, Idle>>,
    /// `forwards.upstream_idle_timeout_ms`.
    idle_timeout: Duration,
    /// Idle connections per worker address, node-wide, for `/metrics`.
    gauges: Arc<WorkerGauges>,
    /// When the last sweep ran (none yet: the first take or put sweeps).
    swept: Cell<Option<Instant>>,
}

impl Pool {
    pub fn new(idle_timeout: Duration, gauges: Arc<WorkerGauges>) -> Pool {
        Pool {
            idle: RefCell::default(),
            idle_timeout,
            gauges,
            swept: Cell::new(None),
        }
    }

    /// An idle connection to the worker at `url` that is neither expired nor closed, if one is
    /// kept. Every connection dropped on the way is counted in `counters`.
    pub fn take(&self, url: &str, counters: &CoreCounters) -> Option<Upstream> {
        self.take_at(url, Instant::now(), counters)
    }

    pub fn put(&self, url: &str, conn: Upstream) {
        self.put_at(url, conn, Instant::now())
    }

    fn take_at(&self, url: &str, now: Instant, counters: &CoreCounters) -> Option<Upstream> {
        let mut idle = self.idle.borrow_mut();
        self.sweep(&mut idle, now);
        let list = idle.get_mut(url)?;
        // The most recently used first: the least likely to have been closed.
        while let Some((mut conn, expires)) = list.pop() {
            if now >= expires {
                counters.pool_dropped(PoolDrop::Expired);
            } else if conn.stream.is_stale() {
                counters.pool_dropped(PoolDrop::Closed);
            } else {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    fn put_at(&self, url: &str, conn: Upstream, now: Instant) {
        if !conn.buf.is_empty() {
            return;
        }
        let keep = match conn.keep_alive {
            Some(announced) => self
                .idle_timeout
                .min(announced.saturating_sub(KEEP_ALIVE_MARGIN)),
            None => self.idle_timeout,
        };
        if keep.is_zero() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        self.sweep(&mut idle, now);
        let list = match idle.get_mut(url) {
            Some(list) => list,
            None => idle.entry(url.to_owned()).or_insert_with(|| Idle {
                conns: Vec::new(),
                gauge: self.gauges.idle_of(url),
            }),
        };
        if list.conns.len() < MAX_IDLE {
            list.gauge.value.fetch_add(1, Ordering::Relaxed);
            list.conns.push((conn, now + keep));
        }
    }

    /// Every [`SWEEP_EVERY`]: drops the idle connections past their expiry and the addresses
    /// left with none. Without it, the connections to a worker that is no longer forwarded to
    /// stayed open (in CLOSE_WAIT once the worker was gone) for the node's life.
    fn sweep(&self, idle: &mut AHashMap<String, Idle>, now: Instant) {
        if self
            .swept
            .get()
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept.set(Some(now));
        idle.retain(|_, list| {
            list.drop_expired(now);
            !list.conns.is_empty()
        });
    }

    /// Idle connections kept, and the addresses they are kept for.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let idle = self.idle.borrow();
        (idle.values().map(|l| l.conns.len()).sum(), idle.len())
    }
}

/// A fresh connection to `addr` (its TLS handshake included, verified by `tls`), within
/// `deadline`.
pub async fn connect(
    addr: &WorkerAddr,
    tls: &ClientTls,
    deadline: Duration,
) -> std::io::Result<Upstream> {
    let stream = match monoio::time::timeout(deadline, addr.connect(tls)).await {
        Ok(result) => result?,
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    };
    Ok(Upstream {
        stream,
        buf: BytesMut::with_capacity(8192),
        reused: false,
        keep_alive: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` connections to a listener of this test's, as the pool would keep them.
    async fn upstreams(listener: &std::net::TcpListener, n: usize) -> Vec<Upstream> {
        let addr =
            WorkerAddr::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let tls = ClientTls::new(None, crate::http::tls::Alpn::Http1).unwrap();
        let mut conns = Vec::new();
        for _ in 0..n {
            conns.push(connect(&addr, &tls, Duration::from_secs(5)).await.unwrap());
        }
        conns
    }

    fn on_a_loop(test: impl std::future::Future<Output = ()>) {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(test);
    }

    fn pool(idle: Duration) -> (Pool, Arc<WorkerGauges>) {
        let gauges = Arc::new(WorkerGauges::default());
        (Pool::new(idle, gauges.clone()), gauges)
    }

    fn dropped(counters: &CoreCounters) -> Vec<(&'static str, u64)> {
        crate::metrics::pool_dropped(std::slice::from_ref(counters))
    }

    #[test]
    fn idle_connections_to_a_worker_no_longer_asked_for_are_closed() {
        on_a_loop(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let idle = Duration::from_secs(30);
            let (pool, gauges) = pool(idle);
            let counters = CoreCounters::default();
            let t0 = Instant::now();
            let mut conns = upstreams(&listener, 3).await;
            // A worker that served a while, then was never forwarded to again (it stopped).
            pool.put_at("http://gone", conns.pop().unwrap(), t0);
            pool.put_at("http://gone", conns.pop().unwrap(), t0);
            // One still in use.
            pool.put_at("http://live", conns.pop().unwrap(), t0);
            assert_eq!(pool.kept(), (3, 2));
            assert_eq!(
                gauges.by_worker(),
                [("http://gone".into(), 0, 2), ("http://live".into(), 0, 1)]
            );

            // Young connections are kept through a sweep.
            let later = t0 + SWEEP_EVERY;
            let conn = pool
                .take_at("http://live", later, &counters)
                .expect("a young idle connection");
            assert!(conn.reused);
            pool.put_at("http://live", conn, later);
            assert_eq!(pool.kept(), (3, 2));

            // Past the idle timeout, traffic to any other worker closes them and forgets the
            // address.
            let old = t0 + idle + Duration::from_secs(1);
            let mut fresh = upstreams(&listener, 1).await;
            pool.put_at("http://other", fresh.pop().unwrap(), old);
            assert_eq!(
                pool.kept(),
                (2, 2),
                "the stopped worker's connections are dropped"
            );
            assert!(pool.take_at("http://gone", old, &counters).is_none());
            assert_eq!(
                gauges.by_worker(),
                [("http://live".into(), 0, 1), ("http://other".into(), 0, 1)]
            );

            // Between sweeps, a put does not walk the pool.
            let mut more = upstreams(&listener, 1).await;
            pool.put_at(
                "http://other",
                more.pop().unwrap(),
                old + Duration::from_secs(1),
            );
            assert_eq!(pool.kept(), (3, 2));
            assert_eq!(dropped(&counters), [("expired", 0), ("closed", 0)]);
        });
    }

    #[test]
    fn a_connection_the_worker_closed_while_idle_is_never_reused() {
        on_a_loop(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let (pool, _) = pool(Duration::from_secs(60));
            let counters = CoreCounters::default();
            let now = Instant::now();
            let mut conns = upstreams(&listener, 2).await;
            let (first, _) = listener.accept().unwrap();
            let (second, _) = listener.accept().unwrap();
            pool.put_at("http://w", conns.remove(0), now);
            pool.put_at("http://w", conns.remove(0), now);
            // The worker times the newer one out (closes it), and answers nothing on the older.
            second.shutdown(std::net::Shutdown::Both).unwrap();
            drop(second);
            monoio::time::sleep(Duration::from_millis(50)).await;
            let conn = pool
                .take_at("http://w", now, &counters)
                .expect("the live one");
            assert!(!conn.stream.is_stale());
            assert_eq!(dropped(&counters), [("expired", 0), ("closed", 1)]);

            // Bytes nobody asked for make a connection stale too.
            pool.put_at("http://w", conn, now);
            std::io::Write::write_all(&mut &first, b"HTTP/1.1 408 Request Timeout\r\n\r\n")
                .unwrap();
            monoio::time::sleep(Duration::from_millis(50)).await;
            assert!(pool.take_at("http://w", now, &counters).is_none());
            assert_eq!(dropped(&counters), [("expired", 0), ("closed", 2)]);
        });
    }

    #[test]
    fn the_idle_timeout_and_a_shorter_worker_keep_alive_bound_reuse() {
        on_a_loop(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let (pool, _) = pool(Duration::from_secs(4));
            let counters = CoreCounters::default();
            let t0 = Instant::now();
            let mut conns = upstreams(&listener, 4).await;
            let _accepted: Vec<_> = (0..4).map(|_| listener.accept().unwrap()).collect();
            // No Keep-Alive header: the node's idle timeout.
            pool.put_at("http://plain", conns.pop().unwrap(), t0);
            assert!(
                pool.take_at("http://plain", t0 + Duration::from_millis(3_900), &counters)
                    .is_some()
            );
            pool.put_at("http://plain", conns.pop().unwrap(), t0);
            assert!(
                pool.take_at("http://plain", t0 + Duration::from_secs(4), &counters)
                    .is_none()
            );
            // `Keep-Alive: timeout=3`: kept 2 s (a second off for the answer's way here).
            let mut short = conns.pop().unwrap();
            short.keep_alive = Some(Duration::from_secs(3));
            pool.put_at("http://short", short, t0);
            assert!(
                pool.take_at("http://short", t0 + Duration::from_secs(2), &counters)
                    .is_none()
            );
            assert_eq!(dropped(&counters), [("expired", 2), ("closed", 0)]);
            // `timeout=1` leaves no time to reuse it: not kept at all.
            let mut none = conns.pop().unwrap();
            none.keep_alive = Some(Duration::from_secs(1));
            pool.put_at("http://none", none, t0);
            assert!(pool.take_at("http://none", t0, &counters).is_none());
        });
    }
}
