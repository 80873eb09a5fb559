//! HTTP/2 to clients: a connection that chose `h2` by ALPN, or began with HTTP/2's preface on a
//! plain listener that takes h2c by prior knowledge, served stream by stream. Each stream is one
//! [`Request`] through the node's one [`Handler`], exactly as an HTTP/1.1 request (its head made
//! the same by [`h2_request_head`]); what differs lives here: the `h2` crate's connection driven
//! on this task beside the streams being answered, a stream's body read from its `DATA` frames
//! (window released as they are taken) and its answer sent as flow control allows.
//!
//! The `h2` crate (0.4, hyper's) owns the frames, HPACK and stream states, and the limits its
//! builder takes: concurrent streams (`http.h2_max_streams`), the header list
//! (`http.max_header_bytes`, past it a 431), `CONTINUATION` frames per header block, streams
//! reset before they are accepted and streams it resets for errors (rapid reset), one pending
//! `PING` answer and `SETTINGS` acknowledgement at a time (read no further until written). On
//! top: the connection's writes bounded by `http.write_timeout_ms` ([`Io`]), a stream waiting
//! for window as long, each body read by the header timeout, a connection with no stream open
//! closed after the idle timeout, and answers still being made for streams the client reset
//! capped at twice the stream limit (past it `GOAWAY` `ENHANCE_YOUR_CALM`).
//!
//! | type | owns |
//! |---|---|
//! | [`h2_builder`] | the `h2` crate's server as every connection is configured |
//! | [`serve`] | one connection: handshake, accepting streams, going away |
//! | [`Stream`] | one stream's body in and answer out, under a [`Request`] (`request::h2_stream`: the request's wire, below this connection) |
//! | [`Io`] | the transport as tokio's I/O traits, with what was read before the switch |
//! | [`sniff_preface`] | a plain connection's first bytes: HTTP/2 or HTTP/1.1 |

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use h2::server::{Builder, SendResponse};
use h2::{Reason, RecvStream};
use http::StatusCode;
use monoio_compat::StreamWrapper;
use tracing::debug;

use crate::conn::read_into;
use crate::handler::{DRAIN_QUIET, Handler, Limits, answer};
use crate::head::{Framing, h2_request_head};
use crate::request::Request;
use crate::request::h2_stream::Stream;
use crate::response::Response;
use crate::shutdown::Shutdown;
use crate::transport::Transport;

/// What every HTTP/2 connection starts with (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Answer bytes a stream may have queued in the connection beyond what the client's window
/// took (the `h2` crate's send buffer, per stream): a client that opens no window costs this
/// much per stream, not the worker's whole answer.
const SEND_BUFFER: usize = 64 * 1024;
/// The window each stream and the connection give the client's bodies.
const WINDOW: u32 = 256 * 1024;

/// What a plain connection began with.
pub enum Sniffed {
    /// HTTP/2's preface (and whatever came with it).
    Preface(BytesMut),
    /// Anything else: HTTP/1.1's first bytes.
    Other(BytesMut),
    /// Closed, or silent past the timeout, before saying which.
    Gone,
}

/// Reads a plain connection's first bytes until they are HTTP/2's preface or cannot be (as
/// many as it takes to tell, at most the preface's 24).
pub async fn sniff_preface(stream: &mut Transport, timeout: Duration) -> Sniffed {
    let mut read = BytesMut::new();
    let reading = async {
        loop {
            let n = read.len().min(PREFACE.len());
            if read[..n] != PREFACE[..n] {
                return Sniffed::Other(std::mem::take(&mut read));
            }
            if n == PREFACE.len() {
                return Sniffed::Preface(std::mem::take(&mut read));
            }
            match read_into(stream, &mut read).await {
                Ok(0) | Err(_) => return Sniffed::Gone,
                Ok(_) => {}
            }
        }
    };
    monoio::time::timeout(timeout, reading)
        .await
        .unwrap_or(Sniffed::Gone)
}

/// The `h2` crate's server as the node configures every connection: `max_streams` streams open
/// at once (`http.h2_max_streams`), header lists up to `max_header_bytes`
/// (`http.max_header_bytes`), `WINDOW` for the client's bodies and `SEND_BUFFER` of answer
/// per stream.
pub fn h2_builder(max_streams: u32, max_header_bytes: usize) -> Builder {
    let mut builder = Builder::new();
    builder
        .max_concurrent_streams(max_streams)
        .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX))
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_send_buffer_size(SEND_BUFFER);
    builder
}

/// Serves the HTTP/2 connection `transport` (`read`: its bytes already read) until the client
/// leaves, it errs, it stays without a stream for the idle timeout, or the core stops (then
/// `GOAWAY`, the streams in flight finish, and it closes).
pub async fn serve<H: Handler>(
    transport: Transport,
    read: BytesMut,
    peer: SocketAddr,
    handler: &H,
    limits: &Limits,
    shutdown: &Shutdown,
) {
    let secure = transport.is_tls();
    let io = Io::new(transport, read, limits.write_timeout);
    let max_streams = limits.http2.max_streams;
    let builder = h2_builder(max_streams, limits.max_header_bytes);
    let handshake = monoio::time::timeout(limits.header_timeout, builder.handshake(io)).await;
    let mut conn = match handshake {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "HTTP/2 handshake timed out");
            return;
        }
    };
    let site = Site {
        peer,
        handler,
        limits,
        shutdown,
        secure,
    };
    let mut streams = FuturesUnordered::new();
    let mut going_away = false;
    loop {
        let quiet = if going_away {
            DRAIN_QUIET
        } else {
            limits.idle_timeout
        };
        monoio::select! {
            accepted = conn.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    // A stream the client reset no longer counts against its limit, but its
                    // answer may still be in the making: past twice the limit of those, the
                    // client is resetting streams to open more (CVE-2023-44487).
                    if streams.len() >= 2 * max_streams as usize {
                        debug!(%peer, "HTTP/2: too many streams in flight, going away");
                        conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                        going_away = true;
                        continue;
                    }
                    streams.push(serve_stream(request, respond, &site));
                }
                Some(Err(e)) => {
                    debug!(%peer, error = %e, "HTTP/2 connection failed");
                    break;
                }
                None => break,
            },
            Some(()) = streams.next(), if !streams.is_empty() => {}
            _ = shutdown.fired(), if !going_away => {
                conn.graceful_shutdown();
                going_away = true;
            }
            // No stream open for the idle timeout (once going away, for a moment): the
            // connection goes away as an idle HTTP/1.1 one closes.
            _ = monoio::time::sleep(quiet), if streams.is_empty() => {
                if going_away {
                    break;
                }
                conn.graceful_shutdown();
                going_away = true;
            }
        }
    }
}

/// What every stream of one connection is served with.
struct Site<'a, H> {
    peer: SocketAddr,
    handler: &'a H,
    limits: &'a Limits,
    shutdown: &'a Shutdown,
    secure: bool,
}

/// One stream: its head made a [`Request`], answered by the handler, the answer sent (or the
/// stream reset when the answer was cut short), then told to the handler.
async fn serve_stream<H: Handler>(
    request: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
    site: &Site<'_, H>,
) {
    let (head, recv) = request.into_parts();
    let judged = h2_request_head(head, recv.is_end_stream());
    // The body is read as the head's framing says: a body declared empty (`content-length: 0`,
    // or `HEADERS` that ended the stream) is not, whatever DATA may follow.
    let declared = matches!(judged, Ok((_, Framing::Length(_) | Framing::Chunked)));
    let mut stream = Stream::new(
        recv,
        respond,
        declared,
        site.secure,
        site.limits.write_timeout,
    );
    let (head, framing) = match judged {
        Ok(head) => head,
        Err(e) => {
            debug!(peer = %site.peer, error = %e, "refusing HTTP/2 request head");
            let mut answer = Response::error(StatusCode::BAD_REQUEST, "bad request");
            site.handler.refused(site.peer, &mut answer);
            stream.answer_whole(&answer, false);
            stream.flush().await;
            return;
        }
    };
    let mut req = Request::over_h2(
        head,
        framing,
        site.peer,
        &mut stream,
        site.shutdown,
        site.limits.header_timeout,
    );
    let mut note = H::Note::default();
    let response = answer(site.handler, &mut req, &mut note).await;
    if !response.is_relayed() {
        req.answer_whole(&response, crate::head_writer::Persistence::Implicit);
    }
    req.flush().await;
    site.handler
        .answered(note, &req, &response, req.bytes_sent());
    drop(req);
    stream.settle();
}

/// A transport as tokio's `AsyncRead`/`AsyncWrite` (monoio-compat's wrapper, what the `h2`
/// crate drives), the bytes read before the switch handed out first, and every write bounded:
/// one that moves nothing for `write_timeout` fails the connection, as HTTP/1.1's writes do
/// (a client that never reads, its `PING` answers and `SETTINGS` acknowledgements piling up,
/// cannot hold it).
pub struct Io {
    inner: StreamWrapper<Transport>,
    read: BytesMut,
    write_timeout: Duration,
    stalled: Option<Pin<Box<monoio::time::Sleep>>>,
}

impl Io {
    fn new(transport: Transport, read: BytesMut, write_timeout: Duration) -> Io {
        Io {
            inner: StreamWrapper::new_with_buffer_size(transport, 16 * 1024, 32 * 1024),
            read,
            write_timeout,
            stalled: None,
        }
    }

    /// `poll` (a write or flush) with the stall bound: pending for `write_timeout` in a row is
    /// an error.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(
            Pin<&mut StreamWrapper<Transport>>,
            &mut Context<'_>,
        ) -> Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(done) = poll(Pin::new(&mut self.inner), cx) {
            self.stalled = None;
            return Poll::Ready(done);
        }
        let timeout = self.write_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(monoio::time::sleep(timeout)));
        ready!(stalled.as_mut().poll(cx));
        Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()))
    }
}

impl tokio::io::AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.bounded(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.bounded(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.bounded(cx, |inner, cx| inner.poll_shutdown(cx))
    }
}
