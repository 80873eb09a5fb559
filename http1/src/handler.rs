//! What serving a connection takes, whichever protocol it speaks: the node's [`Handler`], the
//! [`Limits`] a client connection runs under, how long a draining connection stays
//! ([`DRAIN_QUIET`]), and [`answer`], the one call of the handler. Below both connection loops
//! (HTTP/1.1's `server`, HTTP/2's `h2`), which import it and not each other's.

use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use http::StatusCode;
use tracing::error;

use crate::error::Error;
use crate::request::Request;
use crate::response::Response;

/// Bounds on what one client connection may cost.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Time allowed for a whole request head once its first byte arrived, and for each read of
    /// a request body.
    pub header_timeout: Duration,
    /// Time an idle keep-alive connection is kept waiting for its next request.
    pub idle_timeout: Duration,
    pub max_header_bytes: usize,
    /// Time a client may take no bytes of its answer before the connection is closed.
    pub write_timeout: Duration,
    /// Which clients may speak HTTP/2, and how many streams one connection may have open.
    pub http2: Http2,
}

/// HTTP/2 to clients (served with the `h2` feature; without it, never). Over TLS the
/// listener's ALPN decides (`tls::ServerTls::load`'s `h2`), not this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2 {
    /// Taken by prior knowledge (h2c: a connection that starts with HTTP/2's preface) on a
    /// plain one.
    pub cleartext: bool,
    /// Streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams: u32,
}

impl Http2 {
    /// HTTP/1.1 only (a worker behind the node).
    pub const OFF: Http2 = Http2 {
        cleartext: false,
        max_streams: 128,
    };
}

/// Once the core stops, how long a connection waiting for a request (since its accept or its
/// last answer) is still given to send one. A client on a busy keep-alive connection sends its
/// next request a moment after the last answer: closing under it would lose that request (a
/// reset), so it is answered, with `Connection: close`. One quiet this long is closed, as the
/// idle timeout closes connections, which clients expect.
pub const DRAIN_QUIET: Duration = Duration::from_millis(500);

/// What the node does with a request.
pub trait Handler {
    /// What the handler notes about a request while answering it (the node's access-log
    /// record), handed back to [`Handler::answered`] once the answer is out. Made per request
    /// on the connection task's stack.
    type Note: Default;

    fn handle(
        &self,
        req: &mut Request<'_>,
        note: &mut Self::Note,
    ) -> impl Future<Output = Result<Response, Error>>;

    /// The answer to `req` is written (or queued behind pipelined ones): `sent` bytes went to
    /// the client for it, head included. `response` is what was answered (for a relayed
    /// answer, [`Response::relayed`] with the worker's status).
    fn answered(&self, _note: Self::Note, _req: &Request<'_>, _response: &Response, _sent: u64) {}

    /// An answer the connection gives before any request reached [`Handler::handle`] (a
    /// malformed or too large head, a head that took too long): the handler may add to it.
    fn refused(&self, _peer: SocketAddr, _response: &mut Response) {}

    /// The connection's TLS handshake is done (once, before its first request is read; never on
    /// a plain connection, nor when the handshake fails or times out).
    fn secured(&self) {}
}

/// The handler's answer to `req`: what it returned, or a 500 `internal error` when it failed or
/// panicked (logged). The one call of [`Handler::handle`], whichever protocol the request
/// came by.
pub(crate) async fn answer<H: Handler>(
    handler: &H,
    req: &mut Request<'_>,
    note: &mut H::Note,
) -> Response {
    let peer = req.peer;
    match AssertUnwindSafe(handler.handle(req, note))
        .catch_unwind()
        .await
    {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            error!(%peer, path = req.path(), error = %e, "request failed");
            Response::error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
        Err(_) => {
            // The panic hook has already printed the message and location.
            error!(%peer, path = req.path(), "request handler panicked");
            Response::error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}
