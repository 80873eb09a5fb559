//! The server side of a connection: reads request heads with monoio-codec's `FramedRead` and our
//! [`HeadDecoder`], hands each request to the node's [`Handler`], writes the answer, and keeps
//! the connection alive, bounded by timeouts and sizes so a slow or endless client cannot pin it.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http::{StatusCode, Version};
use monoio::io::stream::Stream;
use monoio::io::{AsyncWriteRent, Splitable};
use monoio::net::TcpStream;
use monoio_codec::FramedRead;
use tracing::debug;

use super::conn::{Conn, read_into};
use super::handler::{DRAIN_QUIET, Handler, Limits, answer};
use super::head::{HeadDecoder, HeadError, recycle_headers};
use super::head_writer::Persistence;
use super::request::Request;
use super::response::Response;
use crate::shutdown::Shutdown;
use crate::tls::ServerTls;
use crate::transport::Transport;

/// Unsent answers past which a connection stops reading pipelined requests until the client
/// takes them: a client that pipelines and never reads costs at most this much (plus the
/// answer being written), not what it sends.
pub const OUTPUT_HIGH_WATER: usize = 64 * 1024;

/// Serves one accepted connection until the client leaves, a limit is hit, or the core shuts
/// down (in-flight requests finish first, answered with `Connection: close`; connections with
/// no request close once quiet for [`DRAIN_QUIET`]). With `tls`, the connection is a TLS
/// handshake first, bounded like a request head.
pub async fn serve_connection<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: &H,
    limits: &Limits,
    shutdown: &Shutdown,
    tls: Option<&ServerTls>,
) {
    // Until its first byte a connection costs its socket and this future, a few hundred bytes:
    // its buffers and the state of a request (about 26 KiB, most of it the handler's future)
    // are allocated once there is something to read. Allocated at accept, 6,000 connections
    // that sent nothing held 160 MB, and faulting that memory in stalled the event loop
    // (reliability.md, "Abuse", idle-10k).
    let readable = request_arrives(
        async { stream.readable(false).await.is_ok() },
        limits.header_timeout,
        Instant::now(),
        shutdown,
    );
    if !readable.await {
        return;
    }
    Box::pin(serve(stream, peer, handler, limits, shutdown, tls)).await;
}

async fn serve<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: &H,
    limits: &Limits,
    shutdown: &Shutdown,
    tls: Option<&ServerTls>,
) {
    // Answers are small and written whole; Nagle would only add latency.
    let _ = stream.set_nodelay(true);
    // The handshake's state (rustls' connection, a few KiB) is part of this boxed future, not
    // of the one every accepted connection holds while it waits for its first byte.
    let stream = match tls {
        None => Transport::Plain(stream),
        Some(tls) => {
            // Not cut by the stop: the client is sending, and its request will be answered.
            match monoio::time::timeout(limits.header_timeout, tls.accept(stream)).await {
                Ok(Ok(transport)) => {
                    handler.secured();
                    transport
                }
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            }
        }
    };
    // What the client sent before its protocol was known: the first request's bytes.
    #[allow(unused_mut)]
    let mut read = BytesMut::new();
    #[cfg(feature = "h2")]
    {
        use crate::h2::{self, Sniffed};
        let mut stream = stream;
        if stream.alpn_is_h2() {
            return h2::serve(stream, read, peer, handler, limits, shutdown).await;
        }
        if !stream.is_tls() && limits.http2.cleartext {
            match h2::sniff_preface(&mut stream, limits.header_timeout).await {
                Sniffed::Preface(bytes) => {
                    return h2::serve(stream, bytes, peer, handler, limits, shutdown).await;
                }
                Sniffed::Other(bytes) => read = bytes,
                Sniffed::Gone => return,
            }
        }
        return serve_http1(stream, read, peer, handler, limits, shutdown).await;
    }
    #[cfg(not(feature = "h2"))]
    serve_http1(stream, read, peer, handler, limits, shutdown).await
}

/// Serves HTTP/1.1 requests on `stream` until the client leaves, a limit is hit or the core
/// stops; `read` holds bytes already read off it.
async fn serve_http1<H: Handler>(
    stream: Transport,
    read: BytesMut,
    peer: SocketAddr,
    handler: &H,
    limits: &Limits,
    shutdown: &Shutdown,
) {
    let secure = stream.is_tls();
    let (reader, writer) = stream.into_split();
    let mut reader =
        FramedRead::with_capacity(reader, HeadDecoder::new(limits.max_header_bytes), 8192);
    reader.read_buffer_mut().extend_from_slice(&read);
    let mut conn = Conn {
        reader,
        writer,
        out: BytesMut::with_capacity(8192),
        sent: 0,
        write_timeout: limits.write_timeout,
        secure,
    };
    let mut first = true;
    loop {
        if conn.reader.read_buffer().is_empty() {
            let wait = if first {
                limits.header_timeout
            } else {
                limits.idle_timeout
            };
            let data =
                async { matches!(conn.reader.peek_data().await, Ok(data) if !data.is_empty()) };
            if !request_arrives(data, wait, Instant::now(), shutdown).await {
                return;
            }
        }
        first = false;
        let (head, framing) = match monoio::time::timeout(limits.header_timeout, conn.reader.next())
            .await
        {
            Ok(Some(Ok(head))) => head,
            Ok(None) | Ok(Some(Err(HeadError::Io(_)))) => return,
            Ok(Some(Err(e))) => {
                debug!(%peer, error = %e, "refusing request head");
                let (status, message) = match e {
                    HeadError::TooLarge(_) => (
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "request header too large",
                    ),
                    HeadError::UnsupportedEncoding => {
                        (StatusCode::NOT_IMPLEMENTED, "unsupported transfer-encoding")
                    }
                    _ => (StatusCode::BAD_REQUEST, "bad request"),
                };
                let mut answer = Response::error(status, message);
                handler.refused(peer, &mut answer);
                refuse(&mut conn, answer).await;
                return;
            }
            Err(_) => {
                let mut timeout = Response::error(StatusCode::REQUEST_TIMEOUT, "request timeout");
                handler.refused(peer, &mut timeout);
                refuse(&mut conn, timeout).await;
                return;
            }
        };
        let version = head.version;
        let mut req = Request::new(
            head,
            framing,
            peer,
            &mut conn,
            shutdown,
            limits.header_timeout,
        );
        let mut note = H::Note::default();
        let response = answer(handler, &mut req, &mut note).await;
        let reusable = req.finish().await;
        // Body bytes may still be arriving: a close then lingers, so the client reads the
        // answer rather than a reset.
        let unread = req.has_body();
        // A relayed head said whether the connection is kept ([`Request::keep_alive`] when it
        // was written), and the server keeps its word: the stop may have begun since.
        let close = response.close || !reusable || (!response.is_relayed() && !req.keep_alive());
        let persistence = match (close, version) {
            (true, _) => Persistence::Close,
            (false, Version::HTTP_10) => Persistence::KeepAlive,
            (false, _) => Persistence::Implicit,
        };
        if !response.is_relayed() {
            req.answer_whole(&response, persistence);
        }
        // With more requests already pipelined, their answers go out in the same write, up to
        // the high-water mark: past it the next request waits until the client reads.
        let flush = close || !req.pipelined() || req.queued() >= OUTPUT_HIGH_WATER;
        let written = !flush || req.flush().await;
        handler.answered(note, &req, &response, req.bytes_sent());
        // Before the next read: the head's values share the read buffer's allocation.
        recycle_headers(std::mem::take(&mut req.head.headers));
        drop(req);
        if !written {
            return;
        }
        if close {
            if unread {
                linger(&mut conn).await;
            }
            return;
        }
    }
}

/// Whether `arrival` (the next request's first bytes) comes within `limit`. Once the core
/// stops, only while the connection has been quiet (since `quiet_since`) less than
/// [`DRAIN_QUIET`].
async fn request_arrives(
    arrival: impl Future<Output = bool>,
    limit: Duration,
    quiet_since: Instant,
    shutdown: &Shutdown,
) -> bool {
    let drained = async {
        shutdown.fired().await;
        let quiet = quiet_since.elapsed();
        monoio::time::sleep(DRAIN_QUIET.saturating_sub(quiet)).await;
    };
    monoio::select! {
        r = monoio::time::timeout(limit, arrival) => r.unwrap_or(false),
        _ = drained => false,
    }
}

/// Sends a final error answer on a connection that will not be read again.
async fn refuse(conn: &mut Conn, response: Response) {
    response.encode(false, Persistence::Close, &mut conn.out);
    if conn.flush().await {
        linger(conn).await;
    }
}

/// Closing a socket with unread input makes the kernel send a reset, which can destroy the
/// answer before the client reads it (RFC 9112 §9.6). So: half-close, then read and discard
/// what the client is still sending, for a bounded time and amount.
async fn linger(conn: &mut Conn) {
    const LINGER: Duration = Duration::from_secs(2);
    const LINGER_BYTES: usize = 8 * 1024 * 1024;
    let _ = conn.writer.shutdown().await;
    let drain = async {
        let mut discarded = 0;
        loop {
            let (io, buf) = conn.reader.read_state_mut();
            discarded += buf.len();
            buf.clear();
            match read_into(io, buf).await {
                Ok(n) if n > 0 && discarded < LINGER_BYTES => {}
                _ => return,
            }
        }
    };
    let _ = monoio::time::timeout(LINGER, drain).await;
}
