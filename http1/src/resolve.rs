//! Connecting to a host by name without blocking the core: a worker by its advertise host, a
//! Redis server by its `redis_url` host.
//!
//! `getaddrinfo` blocks, for as long as a DNS server takes to answer (seconds when one is
//! down), and monoio's own `TcpStream::connect` calls it on the event-loop thread: one slow
//! name would stall every connection of that core. So an IP literal is connected to directly,
//! and a name is resolved on a short-lived thread of its own while the core goes on serving.
//! A name that does not resolve fails like a worker that does not answer.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use monoio::net::TcpStream;

/// A connection to `host:port`; `ip` is `host` already parsed as an IP literal, when it is one.
/// Every address a name has is tried in turn.
pub async fn connect(host: &str, ip: Option<IpAddr>, port: u16) -> io::Result<TcpStream> {
    if let Some(ip) = ip {
        return TcpStream::connect_addr(SocketAddr::new(ip, port)).await;
    }
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in lookup(host, port).await? {
        match TcpStream::connect_addr(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `host`'s addresses, looked up off the event loop.
async fn lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let (tx, rx) = flume::bounded(1);
    let name = host.to_owned();
    std::thread::Builder::new()
        .name("pinboard-dns".into())
        .spawn(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect);
            // The asker may have timed out and gone: nobody to tell then.
            let _ = tx.send(found);
        })?;
    rx.recv_async()
        .await
        .map_err(|_| io::Error::other("resolver thread ended without an answer"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_off_the_core_and_unknown_names_fail() {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(async {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let port = listener.local_addr().unwrap().port();
                assert!(connect("localhost", None, port).await.is_ok());
                let ip = Some("127.0.0.1".parse().unwrap());
                assert!(connect("127.0.0.1", ip, port).await.is_ok());
                assert!(connect("no-such-host.invalid", None, port).await.is_err());
            });
    }
}
