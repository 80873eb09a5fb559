//! A request being served: its head, and its body still on the wire.
//!
//! The body is not read until a handler asks for it, and then chunk by chunk off the
//! connection's read buffer, so a proxied upload streams and a capped JSON body is refused
//! from its declared length without reading it into memory.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode, Version, header};
use monoio::io::{OwnedReadHalf, OwnedWriteHalf};

use super::chunked::{ChunkedDecoder, Piece};
use super::conn::{Conn, read_into};
use super::head::Framing;
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
    conn: &'c mut Conn,
    /// How the head decoder delimited the body: the one decision a forward restates.
    framing: Framing,
    body: BodyState,
    expect_continue: bool,
    keep_alive: bool,
    /// The core's stop: once it fires, the connection ends after this exchange.
    shutdown: &'c Shutdown,
    read_timeout: Duration,
    /// Body bytes handed to the handler so far.
    body_read: u64,
    /// The connection's bytes written or queued when this request began.
    sent_before: u64,
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
        Request {
            keep_alive: wants_keep_alive(&head),
            shutdown,
            body_read: 0,
            sent_before,
            head,
            peer,
            conn,
            framing,
            body,
            expect_continue,
            read_timeout,
        }
    }

    pub fn method(&self) -> &Method {
        &self.head.method
    }

    /// The scheme the request came by: `https` over TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.conn.secure { "https" } else { "http" }
    }

    pub fn path(&self) -> &str {
        self.head.uri.path()
    }

    pub fn header(&self, name: header::HeaderName) -> Option<&HeaderValue> {
        self.head.headers.get(name)
    }

    /// Bytes queued for the client: a handler that relays a response writes it here and
    /// flushes, then answers [`super::Response::relayed`].
    pub fn output(&mut self) -> &mut BytesMut {
        &mut self.conn.out
    }

    /// Writes out what [`Request::output`] holds. False when the client is gone.
    pub async fn flush(&mut self) -> bool {
        self.conn.flush().await
    }

    /// Whether the connection is kept after this exchange: the client wants it (HTTP/1.1
    /// unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`) and the core is
    /// not stopping. Asked when the answer's head is written, so a relayed head says
    /// `Connection: close` whenever the server then closes.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive && !self.shutdown.is_fired()
    }

    pub fn version(&self) -> Version {
        self.head.version
    }

    /// How the body is delimited on the wire, as the head decoder decided it from the client's
    /// `Content-Length` / `Transfer-Encoding`. Nothing downstream reads those headers again.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Whether the request has a body on the wire (declared length or chunked).
    pub fn has_body(&self) -> bool {
        !matches!(self.body, BodyState::Done)
    }

    /// The next piece of the body, `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
        let result = self.next_chunk().await;
        match &result {
            Ok(Some(data)) => self.body_read += data.len() as u64,
            Ok(None) => {}
            Err(_) => self.body = BodyState::Broken,
        }
        result
    }

    /// Body bytes read so far (by the handler, or drained after it).
    pub fn body_bytes_read(&self) -> u64 {
        self.body_read
    }

    /// Bytes written or queued for the client since this request began: its answer, head
    /// included (and a `100 Continue`).
    pub fn bytes_sent(&self) -> u64 {
        self.conn.sent + self.conn.out.len() as u64 - self.sent_before
    }

    /// Whether the client already sent (part of) its next request.
    pub(super) fn pipelined(&self) -> bool {
        !self.conn.reader.read_buffer().is_empty()
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
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
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> Result<(), BodyError> {
        let (io, buf) = self.conn.reader.read_state_mut();
        match monoio::time::timeout(self.read_timeout, read_into(io, buf)).await {
            Err(_) => Err(BodyError::TimedOut),
            Ok(Ok(0)) | Ok(Err(_)) => Err(BodyError::Aborted),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// The whole body, refused with [`BodyError::TooLarge`] past `limit` bytes — from the
    /// declared length when there is one, before reading anything.
    pub async fn read_body(&mut self, limit: usize) -> Result<BytesMut, BodyError> {
        let limit = limit as u64;
        if let BodyState::Length(n) = self.body
            && n > limit
        {
            self.body = BodyState::Broken;
            return Err(BodyError::TooLarge);
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            if (body.len() + chunk.len()) as u64 > limit {
                self.body = BodyState::Broken;
                return Err(BodyError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Called once the response is decided: reads away a small unread body so the connection
    /// can carry the next request. False when the connection must close instead.
    pub(super) async fn finish(&mut self) -> bool {
        let unread_limit = match self.body {
            BodyState::Done => return true,
            BodyState::Broken => return false,
            // A client waiting for `100 Continue` has not sent the body; it never will now.
            _ if self.expect_continue => return false,
            BodyState::Length(n) if n > DRAIN_MAX => return false,
            _ => DRAIN_MAX,
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

    /// Whether body bytes may still be arriving (a response that closes the connection should
    /// then linger so the client sees it rather than a reset).
    pub(super) fn body_unread(&self) -> bool {
        !matches!(self.body, BodyState::Done)
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
    /// Protocols`; the handler then answers [`super::Response::relayed`] with `close`.
    pub fn upgraded(&mut self) -> Upgraded<'_> {
        // Whatever the handler answers, the server loop must not read another request off
        // this connection: what follows the switch is not HTTP.
        self.body = BodyState::Broken;
        let (reader, buffered) = self.conn.reader.read_state_mut();
        Upgraded {
            buffered,
            reader,
            writer: &mut self.conn.writer,
            write_timeout: self.conn.write_timeout,
            shutdown: self.shutdown,
        }
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
