//! HTTP/2 to clients: the frames a client sends after the preface, read by the `h2` crate's
//! server configured as the node configures every connection (`http::h2_builder`, with the
//! default `http.h2_max_streams` and `http.max_header_bytes`), and each stream it accepts made
//! the data plane's by `http::h2_request_head`, then written towards a worker by
//! `proxy::request_head`, as the node's forward does.
//!
//! Input: the client's bytes after the preface, over an in-memory transport that swallows what
//! the server writes; once they are all read and a few polls passed, the client closes. Each
//! stream is answered (its `HEADERS`, up to 4 `DATA` frames of its body read with the window
//! given back, then the answer's body as the window allows), so the flow-control and send paths
//! run too. Every poll is bounded: an input ends in at most `ROUNDS` rounds. Beyond "no panic",
//! it checks that every head `h2_request_head` accepts:
//! - holds at most one `host`, the `:authority` when there was one (except in a plain
//!   `CONNECT`, whose authority is its target: the routes refuse it, as HTTP/1.1's), no
//!   `transfer-encoding`, and came with at most one `host` and one `content-length`;
//! - is framed `Length(n)` exactly when one valid `content-length` n > 0 came, `None` when it
//!   was 0, or none came and `HEADERS` ended the stream, else chunked;
//! - has a target in origin form (`/…`) or `*`, or is a `CONNECT`;
//! - when its target is one the routes forward (origin form), becomes an upstream head that is
//!   one complete HTTP/1.1 head (an independent parse, httparse, ends where it ends), with no
//!   bare CR or LF and no NUL in any line, the method and target as given and one `host`, the
//!   authority; or is refused with nothing of it written: no client can smuggle a line through.
#![no_main]

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use h2::server::{Builder, SendResponse};
use http::{HeaderValue, Method, StatusCode, header};
use libfuzzer_sys::fuzz_target;
use pinboard::config::Config;
use pinboard::correlation::Correlation;
use pinboard::http::{Framing, h2_builder, h2_request_head};
use pinboard::proxy::{Forwarded, request_head};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What every HTTP/2 connection starts with (RFC 9113 §3.4): sent for the client.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Rounds of polling (the connection, then every stream) before an input is given up.
const ROUNDS: usize = 64;
/// Rounds after the client's last byte was read before it closes the connection.
const QUIET: usize = 4;
/// Each stream's answer body.
const ANSWER: &[u8] = b"answered";

/// The node's connection configuration, with the configuration's defaults.
static SERVER: LazyLock<Builder> = LazyLock::new(|| {
    let http = Config::default().http;
    h2_builder(http.h2_max_streams, http.max_header_bytes)
});

/// The client's bytes, how many the server read, and whether the client closed.
struct Wire {
    bytes: Vec<u8>,
    read: Cell<usize>,
    closed: Cell<bool>,
}

impl Wire {
    fn all_read(&self) -> bool {
        self.read.get() == self.bytes.len()
    }
}

/// The server's transport: the client's bytes, then nothing until it closes (the end of the
/// stream); writes are taken whole and dropped.
struct Client(Rc<Wire>);

impl AsyncRead for Client {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let wire = &self.0;
        let rest = &wire.bytes[wire.read.get()..];
        if rest.is_empty() {
            // The driver polls every round: nothing needs waking.
            return match wire.closed.get() {
                true => Poll::Ready(Ok(())),
                false => Poll::Pending,
            };
        }
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        wire.read.set(wire.read.get() + n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Client {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What the client sent in a stream's head, before the node rewrote it.
struct Asked {
    method: Method,
    /// The `:authority`, unless the request is a plain `CONNECT` (no `:scheme`).
    authority: Option<String>,
    hosts: usize,
    lengths: Vec<HeaderValue>,
    coded: bool,
}

impl Asked {
    fn of(head: &http::request::Parts) -> Asked {
        let plain_connect = head.method == Method::CONNECT && head.uri.scheme().is_none();
        Asked {
            method: head.method.clone(),
            authority: head
                .uri
                .authority()
                .filter(|_| !plain_connect)
                .map(|a| a.as_str().to_owned()),
            hosts: head.headers.get_all(header::HOST).iter().count(),
            lengths: head
                .headers
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .cloned()
                .collect(),
            coded: head.headers.contains_key(header::TRANSFER_ENCODING),
        }
    }

    /// The framing the client's head calls for, decided here on its own; `None` for a head
    /// that must be refused.
    fn framing(&self, end_stream: bool) -> Option<Framing> {
        match self.lengths.as_slice() {
            [] if end_stream => Some(Framing::None),
            [] => Some(Framing::Chunked),
            [length] => {
                let digits = length.as_bytes().trim_ascii();
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                match std::str::from_utf8(digits).ok()?.parse::<u64>().ok()? {
                    0 => Some(Framing::None),
                    n => Some(Framing::Length(n)),
                }
            }
            _ => None,
        }
    }

    /// The checks on `head`, what `h2_request_head` made of this one.
    fn check(&self, head: &http::request::Parts, framing: Framing, end_stream: bool) {
        assert!(
            self.hosts <= 1 && !self.coded,
            "accepted {} hosts, transfer-encoding {}",
            self.hosts,
            self.coded
        );
        let hosts: Vec<_> = head.headers.get_all(header::HOST).iter().collect();
        assert!(hosts.len() <= 1, "{} hosts", hosts.len());
        if let Some(authority) = &self.authority {
            assert_eq!(hosts, [authority.as_bytes()], "host is not the :authority");
        }
        assert!(!head.headers.contains_key(header::TRANSFER_ENCODING));
        assert_eq!(
            Some(framing),
            self.framing(end_stream),
            "content-length {:?}, END_STREAM {end_stream}",
            self.lengths
        );
        let target = head.uri.path_and_query().map(|pq| pq.as_str());
        assert!(
            target.is_some_and(|t| t.starts_with('/') || t == "*")
                || head.method == Method::CONNECT,
            "{} {:?}",
            head.method,
            head.uri
        );
        if let Some(target) = target.filter(|t| t.starts_with('/')) {
            self.forwarded(head, target, framing);
        }
    }

    /// The head the forward writes for `head` towards a worker: one clean HTTP/1.1 head, or
    /// nothing.
    fn forwarded(&self, head: &http::request::Parts, target: &str, framing: Framing) {
        let correlation = Correlation::of(&head.headers, || 7);
        let forwarded = Forwarded {
            peer: [127, 0, 0, 1].into(),
            from_trusted_proxy: false,
            scheme: "https",
            epoch: "1700000000001",
            attestation: b"token",
            upgrade: None,
            correlation: &correlation,
            drop_authorization: false,
        };
        let mut out = BytesMut::new();
        let written = request_head(
            &head.method,
            "",
            target,
            &head.headers,
            &forwarded,
            framing.into(),
            &mut out,
        );
        if written.is_err() {
            assert!(out.is_empty(), "a refused head left bytes behind");
            return;
        }
        for (i, &b) in out.iter().enumerate() {
            match b {
                b'\r' => assert_eq!(out.get(i + 1), Some(&b'\n'), "a bare CR at {i}"),
                b'\n' => assert!(i > 0 && out[i - 1] == b'\r', "a bare LF at {i}"),
                0 => panic!("a NUL at {i}"),
                _ => {}
            }
        }
        let mut fields = [httparse::EMPTY_HEADER; 256];
        let mut upstream = httparse::Request::new(&mut fields);
        let parsed = upstream.parse(&out);
        assert!(
            matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
            "not one complete head ({parsed:?}): {:?}",
            String::from_utf8_lossy(&out)
        );
        assert_eq!(upstream.method, Some(self.method.as_str()));
        assert_eq!(upstream.path, Some(target));
        let hosts: Vec<_> = upstream
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .map(|h| h.value)
            .collect();
        assert!(hosts.len() <= 1, "{} hosts upstream", hosts.len());
        if let Some(authority) = &self.authority {
            assert_eq!(hosts, [authority.as_bytes()], "upstream host");
        }
    }
}

/// One stream, as the node serves it: the head checked, the answer's `HEADERS` sent, some of the
/// body read (window given back), then the answer's body.
async fn answer(request: http::Request<RecvStream>, mut respond: SendResponse<Bytes>) {
    let (head, mut body) = request.into_parts();
    let end_stream = body.is_end_stream();
    let asked = Asked::of(&head);
    let status = match h2_request_head(head, end_stream) {
        Ok((head, framing)) => {
            asked.check(&head, framing, end_stream);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    };
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    let Ok(mut send) = respond.send_response(response, false) else {
        return;
    };
    for _ in 0..4 {
        match body.data().await {
            Some(Ok(data)) => {
                let _ = body.flow_control().release_capacity(data.len());
            }
            _ => break,
        }
    }
    send.reserve_capacity(ANSWER.len());
    if let Some(Ok(_)) = poll_fn(|cx| send.poll_capacity(cx)).await {
        let _ = send.send_data(Bytes::from_static(ANSWER), true);
    }
}

fuzz_target!(|data: &[u8]| {
    let wire = Rc::new(Wire {
        bytes: [PREFACE, data].concat(),
        read: Cell::new(0),
        closed: Cell::new(false),
    });
    let mut cx = Context::from_waker(Waker::noop());
    let mut handshake = pin!(SERVER.handshake::<_, Bytes>(Client(wire.clone())));
    // The preface is all it waits for: it is there from the start.
    let handshake = (0..ROUNDS).find_map(|_| match handshake.as_mut().poll(&mut cx) {
        Poll::Ready(done) => Some(done),
        Poll::Pending => None,
    });
    let Some(Ok(mut conn)) = handshake else {
        return;
    };
    let mut streams: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
    let mut accepting = true;
    let mut quiet = 0;
    for _ in 0..ROUNDS {
        if wire.all_read() {
            quiet += 1;
            wire.closed.set(quiet > QUIET);
        }
        while accepting {
            match conn.poll_accept(&mut cx) {
                Poll::Ready(Some(Ok((request, respond)))) => {
                    streams.push(Box::pin(answer(request, respond)));
                }
                Poll::Ready(Some(Err(_)) | None) => accepting = false,
                Poll::Pending => break,
            }
        }
        streams.retain_mut(|stream| stream.as_mut().poll(&mut cx).is_pending());
        if !accepting && streams.is_empty() {
            return;
        }
    }
});
