//! This core's keep-alive connections to workers.
//!
//! Written here rather than taken from `monoio-http-client`, whose pool puts broken connections
//! back and buffers whole bodies. A connection comes back only after a response that was read
//! to its end on an HTTP/1.1 keep-alive exchange; anything else is dropped.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use ahash::AHashMap;
use bytes::BytesMut;
use monoio::net::TcpStream;

use crate::http::WorkerAddr;

/// Idle connections kept per worker address.
const MAX_IDLE: usize = 64;
/// An idle connection older than this is not trusted: the worker may have closed it.
const MAX_IDLE_AGE: Duration = Duration::from_secs(30);

pub struct Upstream {
    pub stream: TcpStream,
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
}

impl Pool {
    /// An idle connection to the worker at `url`, if one is kept.
    pub fn take(&self, url: &str) -> Option<Upstream> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(url)?;
        while let Some((mut conn, since)) = list.pop() {
            if since.elapsed() < MAX_IDLE_AGE {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    pub fn put(&self, url: &str, conn: Upstream) {
        if !conn.buf.is_empty() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        match idle.get_mut(url) {
            Some(list) if list.len() >= MAX_IDLE => {}
            Some(list) => list.push((conn, Instant::now())),
            None => {
                idle.insert(url.to_owned(), vec![(conn, Instant::now())]);
            }
        }
    }
}

/// A fresh connection to `addr`, within `deadline`.
pub async fn connect(addr: &WorkerAddr, deadline: Duration) -> std::io::Result<Upstream> {
    let stream = match monoio::time::timeout(deadline, addr.connect()).await {
        Ok(result) => result?,
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    };
    let _ = stream.set_nodelay(true);
    Ok(Upstream {
        stream,
        buf: BytesMut::with_capacity(8192),
        reused: false,
    })
}
