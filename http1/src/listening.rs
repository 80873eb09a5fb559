//! A listening socket on an event loop, for the node's cores and a worker's serving threads
//! alike: its accepts until a [`Shutdown`], and the stop that takes it out of `LISTEN` at once.
//!
//! Under io_uring the listener's own descriptor outlives its drop until the cancelled accept
//! completes (with deferred task work, until the kernel tears the ring down after the thread
//! ends), and until then the kernel keeps completing handshakes for it that nobody will
//! accept. So an accept in flight is cancelled and awaited, never dropped (a connection it took
//! as the stop came is served, not lost), and [`Listening::stop`] shuts the socket down
//! through a second descriptor.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::Canceller;
use monoio::net::{TcpListener, TcpStream};
use tracing::warn;

use crate::Shutdown;

pub struct Listening {
    listener: TcpListener,
    /// A second descriptor of the same socket, for [`Listening::stop`].
    stopper: std::net::TcpListener,
}

impl Listening {
    /// Must run inside the event loop the socket is to be registered with.
    pub fn new(listener: std::net::TcpListener) -> io::Result<Listening> {
        let stopper = listener.try_clone()?;
        let listener = TcpListener::from_std(listener)?;
        Ok(Listening { listener, stopper })
    }

    /// The next connection, or `None` once `shutdown` fires. A failed accept (typically
    /// EMFILE) is logged (with `whose`, naming the loop) and tried again after a short pause,
    /// instead of spinning on the error.
    pub async fn next(&self, shutdown: &Shutdown, whose: &str) -> Option<(TcpStream, SocketAddr)> {
        loop {
            if shutdown.is_fired() {
                return None;
            }
            // Cancelled and awaited, not dropped: an accept may complete as the stop comes, and
            // a connection it took is served, not lost (on a socket another process accepts
            // on too, the kernel hands it to either).
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
                    warn!(listener = whose, error = %e, "accept failed");
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Stops listening: `shutdown(2)` of a listening socket takes it out of `LISTEN` at once,
    /// whoever still holds a descriptor of it, so new connections are refused from here on.
    /// Not for a socket another process has taken over (it would stop listening there too).
    pub fn stop(self) {
        if let Err(e) = socket2::SockRef::from(&self.stopper).shutdown(std::net::Shutdown::Both) {
            warn!(error = %e, "closing the listener");
        }
    }
}
