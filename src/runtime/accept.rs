//! A listening socket on one core's event loop: its accepts until the stop, and the stop itself
//! (the socket out of `LISTEN` at once, so the kernel completes no more handshakes for it;
//! or, once a new process took the sockets over, left listening for it);
//! which accepted connections are served ([`admit`]: the node's `max_connections`, the limits
//! per client address), and the handler that keeps a served connection's place ([`Admitted`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use monoio::io::Canceller;
use monoio::net::{TcpListener, TcpStream};
use tracing::warn;

use super::Shutdown;
use super::upgrade::Sockets;
use crate::error::{Error, Origin};
use crate::http::{Handler, Request, Response};
use crate::limits::connections::Slot;
use crate::metrics::ConnectionRefusal;
use crate::node::Core;

pub(super) struct Acceptor {
    listener: TcpListener,
    /// A second descriptor of the same socket, to stop listening when the stop begins: under
    /// io_uring the listener's own descriptor outlives its drop until the cancelled accept
    /// completes, and until then the kernel keeps completing handshakes for it.
    stopper: std::net::TcpListener,
    /// The core it runs on, for the log.
    core: usize,
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
        let registering = |e| Error::because(Origin::Internal, "registering the listener", e);
        let stopper = listener.try_clone().map_err(registering)?;
        let listener = TcpListener::from_std(listener).map_err(registering)?;
        Ok(Acceptor {
            listener,
            stopper,
            core,
            sockets,
        })
    }

    /// The next connection, or `None` once `shutdown` fires. A failed accept (typically
    /// EMFILE) is logged and tried again after a short pause, instead of spinning on the error.
    pub(super) async fn next(&self, shutdown: &Shutdown) -> Option<(TcpStream, SocketAddr)> {
        loop {
            if shutdown.is_fired() {
                return None;
            }
            // Cancelled and awaited, not dropped: under io_uring an accept may complete as the
            // stop comes, and a connection it took is served, not lost (on a socket a new
            // process accepts on, the kernel hands it to either).
            let canceller = Canceller::new();
            let mut accept = std::pin::pin!(self.listener.cancelable_accept(canceller.handle()));
            let accepted = monoio::select! {
                r = &mut accept => r,
                _ = shutdown.fired() => {
                    canceller.cancel();
                    return accept.await.ok();
                }
            };
            match accepted {
                Ok(connection) => return Some(connection),
                Err(e) => {
                    warn!(core = self.core, error = %e, "accept failed");
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Stops listening: new connections are refused from here on; or, when a new process
    /// holds the socket too, stops accepting on it only.
    pub(super) fn close(self) {
        // shutdown(2) on a listening socket takes it out of LISTEN at once, whoever still holds
        // a descriptor.
        if self.sockets.held_alone() {
            let _ = socket2::SockRef::from(&self.stopper).shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Whether a connection from `peer` is served, and its place among its address's connections
/// (`None` while `limits.max_connections_per_ip` is off); a refused one is closed at once,
/// before any byte is read. One relaxed read per core and one lock of the address's shard per
/// accept, never per request.
pub(super) fn admit(core: &Core, peer: SocketAddr) -> Result<Option<Slot>, ConnectionRefusal> {
    let shared = &core.shared;
    if shared.connections() >= core.live().config().max_connections {
        return Err(ConnectionRefusal::MaxConnections);
    }
    let handshake = shared.tls.listener.is_some();
    shared.client_connections.admit(peer.ip(), handshake)
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
