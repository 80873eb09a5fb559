//! A listening socket on one core's event loop ([`Listening`]): its accepts until the stop, and
//! the stop itself (the socket out of `LISTEN` at once, so the kernel completes no more
//! handshakes for it; or, once a new process took the sockets over, left listening for it);
//! which accepted connections are served ([`admit`]: the node's `max_connections`, the limits
//! per client address), who the client is on a balancer's connection ([`proxied`]: its PROXY
//! protocol header), and the handler that keeps a served connection's place ([`Admitted`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpStream;
use pinboard_http::Listening;
use pinboard_http::proxy_protocol;
use tracing::debug;

use super::Shutdown;
use super::upgrade::Sockets;
use crate::error::{Error, Origin};
use crate::http::{Handler, Request, Response};
use crate::limits::connections::Slot;
use crate::metrics::ConnectionRefusal;
use crate::node::Core;

pub(super) struct Acceptor {
    listening: Listening,
    /// The core it runs on, for the log.
    core: String,
    /// Whether a new process holds the socket too.
    sockets: Arc<Sockets>,
}

impl Acceptor {
    /// Must run inside the core's event loop, which the socket is registered with.
    pub(super) fn new(
        listener: std::net::TcpListener,
        core: usize,
        sockets: Arc<Sockets>,
    ) -> Result<Acceptor, Error> {
        let listening = Listening::new(listener)
            .map_err(|e| Error::because(Origin::Internal, "registering the listener", e))?;
        Ok(Acceptor {
            listening,
            core: format!("core {core}"),
            sockets,
        })
    }

    /// The next connection, or `None` once `shutdown` fires ([`Listening::next`]).
    pub(super) async fn next(&self, shutdown: &Shutdown) -> Option<(TcpStream, SocketAddr)> {
        self.listening.next(shutdown, &self.core).await
    }

    /// Stops listening: new connections are refused from here on; or, when a new process
    /// holds the socket too, stops accepting on it only.
    pub(super) fn close(self) {
        if self.sockets.held_alone() {
            self.listening.stop();
        }
    }
}

/// Whether a connection from `peer` is served, and its place among its address's connections
/// (`None` while `limits.max_connections_per_ip` is off); a refused one is closed at once,
/// before any byte is read. One relaxed read per core and one lock of the address's shard per
/// accept, never per request. A `balancer`'s connection (`proxy_protocol.trusted`) takes its
/// place among the node's only: its client is known once its header is read ([`proxied`]).
pub(super) fn admit(
    core: &Core,
    peer: SocketAddr,
    balancer: bool,
) -> Result<Option<Slot>, ConnectionRefusal> {
    let shared = &core.shared;
    if shared.connections() >= core.live().config().max_connections {
        return Err(ConnectionRefusal::MaxConnections);
    }
    if balancer {
        return Ok(None);
    }
    admit_client(core, peer)
}

/// `client`'s place among its address's connections (a handshake in progress on a TLS
/// listener).
fn admit_client(core: &Core, client: SocketAddr) -> Result<Option<Slot>, ConnectionRefusal> {
    let shared = &core.shared;
    let handshake = shared.tls.listener.is_some();
    shared.client_connections.admit(client.ip(), handshake)
}

/// The client of a balancer's connection: the source its PROXY header names (the balancer
/// itself for a `LOCAL` or `UNKNOWN` header, its health checks), admitted among that address's
/// connections like a direct one. The header is read whole within `within`, before the TLS
/// handshake or the request it precedes, and nothing past it; a connection without one is
/// closed unanswered.
pub(super) async fn proxied(
    core: &Core,
    stream: &mut TcpStream,
    balancer: SocketAddr,
    within: Duration,
) -> Result<(SocketAddr, Option<Slot>), ConnectionRefusal> {
    let header = proxy_protocol::read_header(stream, within)
        .await
        .map_err(|e| {
            debug!(peer = %balancer, error = %e, "refusing a balancer's connection");
            ConnectionRefusal::ProxyHeader
        })?;
    let client = header.source.unwrap_or(balancer);
    Ok((client, admit_client(core, client)?))
}

/// A served connection's handler: `handler`'s answers, and the connection's place in the table
/// of connections per address, which stops counting as a handshake in progress once the TLS
/// handshake is done.
pub(super) struct Admitted<'h, H> {
    pub handler: &'h H,
    pub slot: Option<Slot>,
}

impl<H: Handler> Handler for Admitted<'_, H> {
    type Note = H::Note;

    fn handle(
        &self,
        req: &mut Request<'_>,
        note: &mut H::Note,
    ) -> impl Future<Output = Result<Response, Error>> {
        self.handler.handle(req, note)
    }

    fn answered(&self, note: H::Note, req: &Request<'_>, response: &Response, sent: u64) {
        self.handler.answered(note, req, response, sent);
    }

    fn refused(&self, peer: SocketAddr, response: &mut Response) {
        self.handler.refused(peer, response);
    }

    fn secured(&self) {
        if let Some(slot) = &self.slot {
            slot.handshake_done();
        }
        self.handler.secured();
    }
}
