//! This core's keep-alive connections to workers.
//!
//! Written here rather than taken from `monoio-http-client`, whose pool puts broken connections
//! back and buffers whole bodies. A connection comes back only after a response that was read
//! to its end on an HTTP/1.1 keep-alive exchange; anything else is dropped. An idle connection
//! is dropped once it is older than [`MAX_IDLE_AGE`]: when it is next taken, or at the sweep
//! of the whole pool that a take or a put runs every [`SWEEP_EVERY`], which is what closes the
//! connections to a worker that nothing is sent to any more (stopped, deregistered, or moved).
//!
//! A connection to an `https` worker is kept and reused the same way, its TLS session with it:
//! a reuse costs no handshake. The key is the whole advertise URL, scheme included, so a plain
//! and a TLS connection to one host and port are never mistaken for each other.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use bytes::BytesMut;

use crate::http::tls::ClientTls;
use crate::http::{Transport, WorkerAddr};

/// Idle connections kept per worker address.
const MAX_IDLE: usize = 64;
/// An idle connection older than this is not trusted: the worker may have closed it.
const MAX_IDLE_AGE: Duration = Duration::from_secs(30);
/// How often a take or a put also drops every idle connection past [`MAX_IDLE_AGE`], whatever
/// its worker, and forgets the addresses left with none.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

pub struct Upstream {
    /// Plain TCP, or TLS over it for an `https` worker.
    pub stream: Transport,
    /// Bytes read from the worker and not yet consumed.
    pub buf: BytesMut,
    /// Whether this connection already carried a request (a failure on it may be a stale
    /// keep-alive rather than a dead worker).
    pub reused: bool,
}

/// Idle connections by advertise URL (borrowed for lookups: nothing allocated per request).
#[derive(Default)]
pub struct Pool {
    idle: RefCell<AHashMap<String, Vec<(Upstream, Instant)>>>,
    /// When the last sweep ran (none yet: the first take or put sweeps).
    swept: Cell<Option<Instant>>,
}

impl Pool {
    /// An idle connection to the worker at `url`, if one is kept.
    pub fn take(&self, url: &str) -> Option<Upstream> {
        self.take_at(url, Instant::now())
    }

    pub fn put(&self, url: &str, conn: Upstream) {
        self.put_at(url, conn, Instant::now())
    }

    fn take_at(&self, url: &str, now: Instant) -> Option<Upstream> {
        let mut idle = self.idle.borrow_mut();
        self.sweep(&mut idle, now);
        let list = idle.get_mut(url)?;
        while let Some((mut conn, since)) = list.pop() {
            if now.saturating_duration_since(since) < MAX_IDLE_AGE {
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
        let mut idle = self.idle.borrow_mut();
        self.sweep(&mut idle, now);
        match idle.get_mut(url) {
            Some(list) if list.len() >= MAX_IDLE => {}
            Some(list) => list.push((conn, now)),
            None => {
                idle.insert(url.to_owned(), vec![(conn, now)]);
            }
        }
    }

    /// Every [`SWEEP_EVERY`]: drops the idle connections past [`MAX_IDLE_AGE`] and the
    /// addresses left with none. Without it, the connections to a worker that is no longer
    /// forwarded to stayed open (in CLOSE_WAIT once the worker was gone) for the node's life.
    fn sweep(&self, idle: &mut AHashMap<String, Vec<(Upstream, Instant)>>, now: Instant) {
        if self
            .swept
            .get()
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept.set(Some(now));
        idle.retain(|_, list| {
            list.retain(|(_, since)| now.saturating_duration_since(*since) < MAX_IDLE_AGE);
            !list.is_empty()
        });
    }

    /// Idle connections kept, and the addresses they are kept for.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let idle = self.idle.borrow();
        (idle.values().map(Vec::len).sum(), idle.len())
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

    #[test]
    fn idle_connections_to_a_worker_no_longer_asked_for_are_closed() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let pool = Pool::default();
            let t0 = Instant::now();
            let mut conns = upstreams(&listener, 3).await;
            // A worker that served a while, then was never forwarded to again (it stopped).
            pool.put_at("http://gone", conns.pop().unwrap(), t0);
            pool.put_at("http://gone", conns.pop().unwrap(), t0);
            // One still in use.
            pool.put_at("http://live", conns.pop().unwrap(), t0);
            assert_eq!(pool.kept(), (3, 2));

            // Young connections are kept through a sweep.
            let later = t0 + SWEEP_EVERY;
            let conn = pool
                .take_at("http://live", later)
                .expect("a young idle connection");
            assert!(conn.reused);
            pool.put_at("http://live", conn, later);
            assert_eq!(pool.kept(), (3, 2));

            // Past the idle age, traffic to any other worker closes them and forgets the address.
            let old = t0 + MAX_IDLE_AGE + Duration::from_secs(1);
            let mut fresh = upstreams(&listener, 1).await;
            pool.put_at("http://other", fresh.pop().unwrap(), old);
            assert_eq!(
                pool.kept(),
                (2, 2),
                "the stopped worker's connections are dropped"
            );
            assert!(pool.take_at("http://gone", old).is_none());

            // Between sweeps, a put does not walk the pool.
            let mut more = upstreams(&listener, 1).await;
            pool.put_at(
                "http://other",
                more.pop().unwrap(),
                old + Duration::from_secs(1),
            );
            assert_eq!(pool.kept(), (3, 2));
        });
    }
}
