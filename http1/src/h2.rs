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
//! | [`Stream`] | one stream's body in and answer out, under a [`Request`] |
//! | [`Io`] | the transport as tokio's I/O traits, with what was read before the switch |
//! | [`sniff_preface`] | a plain connection's first bytes: HTTP/2 or HTTP/1.1 |

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use h2::server::{Builder, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, StatusCode, header};
use monoio_compat::StreamWrapper;
use tracing::debug;

use crate::conn::read_into;
use crate::handler::{DRAIN_QUIET, Handler, Limits, answer};
use crate::head::{Framing, h2_request_head};
use crate::head_writer::{BodyFraming, HeadWriter, Unwritable};
use crate::request::{BodyError, Request};
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
    let mut stream = Stream {
        body: if declared { Body::Open } else { Body::Done },
        recv,
        respond,
        send: None,
        head: None,
        queued: Vec::new(),
        ended: false,
        finished: false,
        sent: 0,
        secure: site.secure,
        write_timeout: site.limits.write_timeout,
    };
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

enum Body {
    Open,
    Done,
    /// Left half-read after an error.
    Broken,
}

/// One HTTP/2 stream under a [`Request`]: its body as it arrives, and its answer, started,
/// queued and sent as the client's window allows.
pub struct Stream {
    recv: RecvStream,
    body: Body,
    respond: SendResponse<Bytes>,
    /// Once the answer's `HEADERS` went.
    send: Option<SendStream<Bytes>>,
    /// The answer's head, started and not sent yet (it goes with the first flush).
    head: Option<http::Response<()>>,
    /// Body pieces queued and not sent yet.
    queued: Vec<Bytes>,
    /// The answer's end is queued (`END_STREAM` goes with the last piece).
    ended: bool,
    /// `END_STREAM` went.
    finished: bool,
    /// Answer bytes sent or queued: the head's fields, then the body.
    pub(crate) sent: u64,
    pub(crate) secure: bool,
    write_timeout: Duration,
}

impl Stream {
    pub(crate) fn has_body(&self) -> bool {
        !matches!(self.body, Body::Done)
    }

    pub(crate) fn break_body(&mut self) {
        self.body = Body::Broken;
    }

    /// The next `DATA` frame's bytes, the window they took given back to the client.
    pub(crate) async fn next_chunk(
        &mut self,
        read_timeout: Duration,
    ) -> Result<Option<Bytes>, BodyError> {
        match self.body {
            Body::Done => return Ok(None),
            Body::Broken => return Err(BodyError::Malformed),
            Body::Open => {}
        }
        loop {
            let data = monoio::time::timeout(read_timeout, self.recv.data()).await;
            match data {
                Err(_) => return Err(BodyError::TimedOut),
                Ok(None) => {
                    self.body = Body::Done;
                    return Ok(None);
                }
                // A body longer or shorter than its `Content-Length` is the stream's error.
                Ok(Some(Err(e))) if e.reason() == Some(Reason::PROTOCOL_ERROR) => {
                    return Err(BodyError::Malformed);
                }
                Ok(Some(Err(_))) => return Err(BodyError::Aborted),
                Ok(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if !data.is_empty() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The answer's head: `fields` (checked as HTTP/1.1's are), then the length when known.
    pub(crate) fn start_answer(
        &mut self,
        status: StatusCode,
        framing: BodyFraming,
        fields: impl FnOnce(&mut HeadWriter<'_>) -> Result<(), Unwritable>,
    ) -> Result<(), Unwritable> {
        let mut map = HeaderMap::new();
        let mut head = HeadWriter::fields(&mut map);
        fields(&mut head)?;
        head.framing(framing)?;
        head.finish()?;
        self.sent += fields_len(&map);
        let mut answer = http::Response::new(());
        *answer.status_mut() = status;
        *answer.headers_mut() = map;
        self.head = Some(answer);
        Ok(())
    }

    pub(crate) fn answer_data(&mut self, data: Bytes) {
        self.sent += data.len() as u64;
        self.queued.push(data);
    }

    pub(crate) fn end_answer(&mut self) {
        self.ended = true;
    }

    /// A whole answer of the node's own: its fields, `Date`, the length, and the body
    /// (announced but not sent to `HEAD`).
    pub(crate) fn answer_whole(&mut self, response: &Response, head_request: bool) {
        let written = self.start_answer(response.status, response.framing(), |head| {
            for (name, value) in &response.headers {
                head.field(name, value.as_bytes())?;
            }
            head.field(&header::DATE, crate::response::date::value().as_bytes())
        });
        if written.is_err() {
            // The node's own fields are valid by construction; a head it cannot write is a
            // bug, and the stream is reset rather than answered wrongly.
            return;
        }
        if let Some(body) = response.body_sent(head_request) {
            self.answer_data(body.clone());
        }
        self.end_answer();
    }

    /// Sends the head and the queued pieces as the stream's window opens; false once the
    /// client reset the stream or gave it no window for the write timeout (then it is reset).
    pub(crate) async fn flush(&mut self) -> bool {
        if let Some(head) = self.head.take() {
            let end = self.ended && self.queued.is_empty();
            match self.respond.send_response(head, end) {
                Ok(send) => self.send = Some(send),
                Err(_) => return false,
            }
            self.finished = end;
        }
        let Some(send) = &mut self.send else {
            return true;
        };
        let pieces = std::mem::take(&mut self.queued);
        let last = pieces.len();
        for (i, mut piece) in pieces.into_iter().enumerate() {
            let end_with = self.ended && i + 1 == last;
            self.finished |= end_with;
            while !piece.is_empty() {
                send.reserve_capacity(piece.len());
                let window = poll_fn(|cx| send.poll_capacity(cx));
                let n = match monoio::time::timeout(self.write_timeout, window).await {
                    Ok(Some(Ok(n))) if n > 0 => n.min(piece.len()),
                    Ok(Some(Ok(_))) => continue,
                    Ok(Some(Err(_))) | Ok(None) => return false,
                    Err(_) => {
                        send.send_reset(Reason::CANCEL);
                        return false;
                    }
                };
                let chunk = piece.split_to(n);
                if send.send_data(chunk, end_with && piece.is_empty()).is_err() {
                    return false;
                }
            }
        }
        if self.ended && !self.finished {
            self.finished = true;
            return send.send_data(Bytes::new(), true).is_ok();
        }
        true
    }

    /// After the handler: an answer never ended (cut short, or never given) resets the stream,
    /// so the client does not take it as complete.
    fn settle(&mut self) {
        if self.ended {
            return;
        }
        match &mut self.send {
            Some(send) => send.send_reset(Reason::INTERNAL_ERROR),
            None => self.respond.send_reset(Reason::INTERNAL_ERROR),
        }
    }
}

/// What an answer's fields take on the wire, uncompressed (as HTTP/1.1 would carry them): what
/// the access log counts as its head.
fn fields_len(fields: &HeaderMap) -> u64 {
    fields
        .iter()
        .map(|(name, value)| (name.as_str().len() + value.len() + 4) as u64)
        .sum()
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
