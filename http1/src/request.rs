//! A request being served, whichever protocol brought it: its head, its body still on the wire,
//! and the answer a handler streams itself. The data plane sees only this type: an HTTP/1.1
//! request and an HTTP/2 stream go through the same admission, placement and forward.
//!
//! The body is not read until a handler asks for it, and then chunk by chunk (off the
//! connection's read buffer, or the stream's `DATA` frames), so a proxied upload streams and a
//! capped JSON body is refused from its declared length without reading it into memory.
//! HTTP/1.1's wire is [`H1`] here; an HTTP/2 stream's is [`h2_stream::Stream`].

#[cfg(feature = "h2")]
pub(crate) mod h2_stream;

use std::net::SocketAddr;
use std::time::Duration;

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode, Version, header};
use monoio::io::{OwnedReadHalf, OwnedWriteHalf};

use super::chunked::{ChunkedDecoder, Piece};
use super::conn::{Conn, read_into};
use super::head::Framing;
use super::head_writer::{BodyFraming, HeadWriter, Persistence, Unwritable, answer_head};
use super::response::Response;
use super::shutdown::Shutdown;
use super::transport::Transport;

/// Largest leftover body drained to keep a connection alive after a handler that did not read
/// it; past this, closing is cheaper than reading.
const DRAIN_MAX: u64 = 64 * 1024;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("body larger than the limit")]
    TooLarge,
    #[error("malformed body framing")]
    Malformed,
    #[error("client closed the connection mid-body")]
    Aborted,
    #[error("client too slow sending the body")]
    TimedOut,
}

impl BodyError {
    /// The answer to a request whose body failed this way: 413 `body too large`, 408 `request
    /// timeout`, or 400 `bad request` (a malformed body, or one cut off, which no one may
    /// read). Closing: what is left of the body cannot be told from a next request.
    pub fn answer(&self) -> Response {
        let (status, message) = match self {
            BodyError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
            BodyError::TimedOut => (StatusCode::REQUEST_TIMEOUT, "request timeout"),
            BodyError::Malformed | BodyError::Aborted => (StatusCode::BAD_REQUEST, "bad request"),
        };
        Response::error(status, message).closing()
    }
}

enum BodyState {
    Length(u64),
    Chunked(ChunkedDecoder),
    Done,
    /// Left half-read after an error: the connection cannot carry another request.
    Broken,
}

pub struct Request<'c> {
    pub head: http::request::Parts,
    pub peer: SocketAddr,
    /// How the body is delimited: decided once, by the head decoder (HTTP/1.1) or from the
    /// stream's `HEADERS` (HTTP/2), and only restated downstream.
    framing: Framing,
    wire: Wire<'c>,
    /// Whether the connection is TLS (the scheme a forward states as `X-Forwarded-Proto`).
    secure: bool,
    /// The core's stop: once it fires, the connection ends after this exchange.
    shutdown: &'c Shutdown,
    read_timeout: Duration,
    /// Body bytes handed to the handler so far.
    body_read: u64,
}

/// The protocol a request came by, and its state there.
enum Wire<'c> {
    H1(H1<'c>),
    #[cfg(feature = "h2")]
    H2(&'c mut h2_stream::Stream),
}

/// An HTTP/1.1 request's connection and where its body is.
struct H1<'c> {
    conn: &'c mut Conn,
    body: BodyState,
    expect_continue: bool,
    keep_alive: bool,
    /// The connection's bytes written or queued when this request began.
    sent_before: u64,
    /// How the answer [`Request::start_answer`] began delimits its body: what its pieces and
    /// its end are framed by.
    answering: BodyFraming,
}

impl<'c> Request<'c> {
    pub(super) fn new(
        head: http::request::Parts,
        framing: Framing,
        peer: SocketAddr,
        conn: &'c mut Conn,
        shutdown: &'c Shutdown,
        read_timeout: Duration,
    ) -> Request<'c> {
        let expect_continue = head.version == Version::HTTP_11
            && head
                .headers
                .get(header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let body = match framing {
            Framing::None => BodyState::Done,
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::default()),
        };
        let sent_before = conn.sent + conn.out.len() as u64;
        let secure = conn.secure;
        let h1 = H1 {
            keep_alive: wants_keep_alive(&head),
            sent_before,
            conn,
            body,
            expect_continue,
            answering: BodyFraming::None,
        };
        Request {
            head,
            peer,
            framing,
            wire: Wire::H1(h1),
            secure,
            shutdown,
            read_timeout,
            body_read: 0,
        }
    }

    #[cfg(feature = "h2")]
    pub(super) fn over_h2(
        head: http::request::Parts,
        framing: Framing,
        peer: SocketAddr,
        stream: &'c mut h2_stream::Stream,
        shutdown: &'c Shutdown,
        read_timeout: Duration,
    ) -> Request<'c> {
        Request {
            secure: stream.secure,
            head,
            peer,
            framing,
            wire: Wire::H2(stream),
            shutdown,
            read_timeout,
            body_read: 0,
        }
    }

    pub fn method(&self) -> &Method {
        &self.head.method
    }

    /// The scheme the request came by: `https` over TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.secure { "https" } else { "http" }
    }

    pub fn path(&self) -> &str {
        self.head.uri.path()
    }

    pub fn header(&self, name: header::HeaderName) -> Option<&HeaderValue> {
        self.head.headers.get(name)
    }

    /// Starts the answer a handler streams itself (a relayed worker answer, a streamed
    /// listing): its status, the fields `fields` writes, how its body is delimited and (on
    /// HTTP/1.1) the connection's persistence, stated after them. Its body follows with
    /// [`Request::answer_data`], then [`Request::end_answer`], and goes out with
    /// [`Request::flush`]; the handler then answers [`super::Response::relayed`]. On
    /// [`Unwritable`] nothing of the head is queued. On HTTP/2 `framing` states only a length
    /// and `persistence` nothing: the stream frames the body and the connection outlives it.
    pub fn start_answer(
        &mut self,
        status: StatusCode,
        framing: BodyFraming,
        persistence: Persistence,
        fields: impl FnOnce(&mut HeadWriter<'_>) -> Result<(), Unwritable>,
    ) -> Result<(), Unwritable> {
        match &mut self.wire {
            Wire::H1(h1) => {
                answer_head(&mut h1.conn.out, status, framing, persistence, fields)?;
                h1.answering = framing;
                Ok(())
            }
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.start_answer(status, framing, fields),
        }
    }

    /// Queues a piece of the answer's body (chunk-framed when the head said chunked).
    pub fn answer_data(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        match &mut self.wire {
            Wire::H1(h1) => {
                let out = &mut h1.conn.out;
                if h1.answering == BodyFraming::Chunked {
                    let _ = write!(out.writer(), "{:x}\r\n", data.len());
                    out.put_slice(&data);
                    out.put_slice(b"\r\n");
                } else {
                    out.put_slice(&data);
                }
            }
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.answer_data(data),
        }
    }

    /// Queues the end of the answer's body (the last chunk, when the head said chunked; an
    /// HTTP/2 `END_STREAM`). An answer never ended is one cut short: HTTP/1.1 closes the
    /// connection under it, HTTP/2 resets the stream.
    pub fn end_answer(&mut self) {
        match &mut self.wire {
            Wire::H1(h1) => {
                if h1.answering == BodyFraming::Chunked {
                    h1.conn.out.put_slice(b"0\r\n\r\n");
                }
            }
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.end_answer(),
        }
    }

    /// Queues a whole answer of the node's own, after the request's body was dealt with.
    /// `persistence` is what an HTTP/1.1 answer says of the connection.
    pub(super) fn answer_whole(&mut self, response: &Response, persistence: Persistence) {
        let head_request = self.head.method == Method::HEAD;
        match &mut self.wire {
            Wire::H1(h1) => response.encode(head_request, persistence, &mut h1.conn.out),
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.answer_whole(response, head_request),
        }
    }

    /// Sends what the answer has queued. False when the client is gone (or took no byte for
    /// the write timeout, or on HTTP/2 gave the stream no window to send in for as long).
    pub async fn flush(&mut self) -> bool {
        match &mut self.wire {
            Wire::H1(h1) => h1.conn.flush().await,
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.flush().await,
        }
    }

    /// Whether the connection is kept after this exchange: the client wants it (HTTP/1.1
    /// unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`; always on
    /// HTTP/2, whose streams end alone) and the core is not stopping. Asked when the answer's
    /// head is written, so a relayed head says `Connection: close` whenever the server then
    /// closes.
    pub fn keep_alive(&self) -> bool {
        let wanted = match &self.wire {
            Wire::H1(h1) => h1.keep_alive,
            #[cfg(feature = "h2")]
            Wire::H2(_) => true,
        };
        wanted && !self.shutdown.is_fired()
    }

    pub fn version(&self) -> Version {
        self.head.version
    }

    /// How the body is delimited on the wire, as the head decoder decided it from the client's
    /// `Content-Length` / `Transfer-Encoding`. Nothing downstream reads those headers again.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Whether the request has a body still to come (declared length, chunked, or an HTTP/2
    /// stream not ended).
    pub fn has_body(&self) -> bool {
        match &self.wire {
            Wire::H1(h1) => !matches!(h1.body, BodyState::Done),
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.has_body(),
        }
    }

    /// The next piece of the body, `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
        let result = match &mut self.wire {
            Wire::H1(h1) => h1.next_chunk(self.read_timeout).await,
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.next_chunk(self.read_timeout).await,
        };
        match &result {
            Ok(Some(data)) => self.body_read += data.len() as u64,
            Ok(None) => {}
            Err(_) => self.break_body(),
        }
        result
    }

    /// The body can no longer be read: what is left of it cannot be told from what follows.
    fn break_body(&mut self) {
        match &mut self.wire {
            Wire::H1(h1) => h1.body = BodyState::Broken,
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.break_body(),
        }
    }

    /// Body bytes read so far (by the handler, or drained after it).
    pub fn body_bytes_read(&self) -> u64 {
        self.body_read
    }

    /// Bytes written or queued for the client since this request began: its answer, head
    /// included (and a `100 Continue`).
    pub fn bytes_sent(&self) -> u64 {
        match &self.wire {
            Wire::H1(h1) => h1.conn.sent + h1.conn.out.len() as u64 - h1.sent_before,
            #[cfg(feature = "h2")]
            Wire::H2(stream) => stream.sent,
        }
    }

    /// The whole body, refused with [`BodyError::TooLarge`] past `limit` bytes — from the
    /// declared length when there is one, before reading anything.
    pub async fn read_body(&mut self, limit: usize) -> Result<BytesMut, BodyError> {
        let limit = limit as u64;
        if let Framing::Length(n) = self.framing
            && n > limit
        {
            self.break_body();
            return Err(BodyError::TooLarge);
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            if (body.len() + chunk.len()) as u64 > limit {
                self.break_body();
                return Err(BodyError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Answer bytes queued on the connection and not yet written (this answer's, and those of
    /// requests pipelined before it).
    pub(super) fn queued(&self) -> usize {
        match &self.wire {
            Wire::H1(h1) => h1.conn.out.len(),
            #[cfg(feature = "h2")]
            Wire::H2(_) => 0,
        }
    }

    /// Whether the client already sent (part of) its next request.
    pub(super) fn pipelined(&self) -> bool {
        match &self.wire {
            Wire::H1(h1) => !h1.conn.reader.read_buffer().is_empty(),
            #[cfg(feature = "h2")]
            Wire::H2(_) => false,
        }
    }

    /// Called once the response is decided: reads away a small unread body so the connection
    /// can carry the next request. False when the connection must close instead.
    pub(super) async fn finish(&mut self) -> bool {
        let unread_limit = match &self.wire {
            Wire::H1(h1) => match h1.body {
                BodyState::Done => return true,
                BodyState::Broken => return false,
                // A client waiting for `100 Continue` has not sent the body; it never will now.
                _ if h1.expect_continue => return false,
                BodyState::Length(n) if n > DRAIN_MAX => return false,
                _ => DRAIN_MAX,
            },
            // An HTTP/2 stream's unread body is refused by resetting the stream, not read.
            #[cfg(feature = "h2")]
            Wire::H2(_) => return true,
        };
        let mut drained = 0u64;
        loop {
            match self.chunk().await {
                Ok(None) => return true,
                Ok(Some(c)) => {
                    drained += c.len() as u64;
                    if drained > unread_limit {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
    }
}

impl H1<'_> {
    async fn next_chunk(&mut self, read_timeout: Duration) -> Result<Option<Bytes>, BodyError> {
        if self.expect_continue {
            self.expect_continue = false;
            self.conn
                .out
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !self.conn.flush().await {
                return Err(BodyError::Aborted);
            }
        }
        loop {
            match &mut self.body {
                BodyState::Done => return Ok(None),
                BodyState::Broken => return Err(BodyError::Malformed),
                BodyState::Length(remaining) => {
                    let buf = self.conn.reader.read_buffer_mut();
                    if !buf.is_empty() {
                        let n = (*remaining).min(buf.len() as u64);
                        let data = buf.split_to(n as usize).freeze();
                        *remaining -= n;
                        if *remaining == 0 {
                            self.body = BodyState::Done;
                        }
                        return Ok(Some(data));
                    }
                }
                BodyState::Chunked(decoder) => {
                    match decoder.decode(self.conn.reader.read_buffer_mut()) {
                        Err(_) => return Err(BodyError::Malformed),
                        Ok(Some(Piece::Data(data))) => return Ok(Some(data)),
                        Ok(Some(Piece::End)) => {
                            self.body = BodyState::Done;
                            return Ok(None);
                        }
                        Ok(None) => {}
                    }
                }
            }
            let (io, buf) = self.conn.reader.read_state_mut();
            match monoio::time::timeout(read_timeout, read_into(io, buf)).await {
                Err(_) => return Err(BodyError::TimedOut),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(BodyError::Aborted),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// The client connection's raw halves once a handler switched protocols (a relayed `101`):
/// from then on bytes are copied as they come, and no HTTP is read or written on it again.
pub struct Upgraded<'a> {
    /// Bytes the client sent past the request: the new protocol's first bytes, which may have
    /// arrived with the head. They go out before anything read from `reader`.
    pub buffered: &'a mut BytesMut,
    pub reader: &'a mut OwnedReadHalf<Transport>,
    pub writer: &'a mut OwnedWriteHalf<Transport>,
    /// How long a write to the client may move no byte (`http.write_timeout_ms`).
    pub write_timeout: Duration,
    /// The core's stop, whose end of the grace a tunnel says goodbye at.
    pub shutdown: &'a Shutdown,
}

impl Request<'_> {
    /// Hands the connection over after the handler wrote and flushed a `101 Switching
    /// Protocols`; the handler then answers [`super::Response::relayed`] with `close`. `None`
    /// on HTTP/2, which switches no protocol (its requests are never upgrades).
    pub fn upgraded(&mut self) -> Option<Upgraded<'_>> {
        // Without the `h2` feature HTTP/1.1 is the only wire, and the pattern always matches.
        #[allow(irrefutable_let_patterns)]
        let Wire::H1(h1) = &mut self.wire else {
            return None;
        };
        // Whatever the handler answers, the server loop must not read another request off
        // this connection: what follows the switch is not HTTP.
        h1.body = BodyState::Broken;
        let (reader, buffered) = h1.conn.reader.read_state_mut();
        Some(Upgraded {
            buffered,
            reader,
            writer: &mut h1.conn.writer,
            write_timeout: h1.conn.write_timeout,
            shutdown: self.shutdown,
        })
    }
}

fn wants_keep_alive(head: &http::request::Parts) -> bool {
    let mut keep = head.version != Version::HTTP_10;
    for value in head.headers.get_all(header::CONNECTION) {
        for token in value.as_bytes().split(|b| *b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") {
                return false;
            }
            if token.eq_ignore_ascii_case(b"keep-alive") {
                keep = true;
            }
        }
    }
    keep
}
