//! Header rewriting at both edges of a forward, written straight into the connection's output
//! buffer (no intermediate header map, nothing allocated per request):
//!
//! - towards the worker: every inbound `Pinboard-*` header stripped, hop-by-hop headers (and
//!   every header `Connection` names) dropped, `X-Forwarded-For` replaced by the observed peer,
//!   `Pinboard-Epoch` and `Pinboard-Attestation` added, framing restated;
//! - towards the client: `Pinboard-*` and hop-by-hop headers dropped, `X-Accel-Buffering: no`
//!   added, framing restated.

use std::io::Write;
use std::net::IpAddr;

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderName, Method, StatusCode, header};

use crate::correlation::{Correlation, REQUEST_ID, TRACEPARENT, TRACESTATE};
use crate::http::Framing;

/// How a message body is delimited on the wire we write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (only towards an HTTP/1.0 client).
    Close,
}

impl From<Framing> for BodyFraming {
    fn from(framing: Framing) -> BodyFraming {
        match framing {
            Framing::None => BodyFraming::None,
            Framing::Length(n) => BodyFraming::Length(n),
            Framing::Chunked => BodyFraming::Chunked,
        }
    }
}

impl BodyFraming {
    fn encode(self, dst: &mut BytesMut) {
        match self {
            BodyFraming::Length(n) => {
                let _ = write!(dst.writer(), "content-length: {n}\r\n");
            }
            BodyFraming::Chunked => dst.put_slice(b"transfer-encoding: chunked\r\n"),
            BodyFraming::None | BodyFraming::Close => {}
        }
    }
}

/// RFC 9110 §7.6.1's hop-by-hop headers, plus `Expect` (we answer `100 Continue` ourselves)
/// and the framing headers, which are restated for each hop.
fn hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == "keep-alive"
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::CONTENT_LENGTH
        || name == header::EXPECT
}

/// `pinboard-*` and `pinboard_*`: some stacks (CGI, nginx's `underscores_in_headers`) read an
/// underscore as a dash, so a `Pinboard_Epoch` must not slip past the strip either. Names
/// arrive lowercased.
fn is_pinboard(name: &HeaderName) -> bool {
    name.as_str()
        .strip_prefix("pinboard")
        .is_some_and(|rest| rest.starts_with(['-', '_']))
}

/// Whether `Connection` lists `name` (those headers are hop-by-hop too).
fn named_by_connection(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.as_bytes().split(|b| *b == b',').any(|token| {
            token
                .trim_ascii()
                .eq_ignore_ascii_case(name.as_str().as_bytes())
        })
    })
}

fn copy_end_to_end(headers: &HeaderMap, skip: impl Fn(&HeaderName) -> bool, dst: &mut BytesMut) {
    let connection_lists = headers.contains_key(header::CONNECTION);
    for (name, value) in headers {
        if hop_by_hop(name)
            || is_pinboard(name)
            || skip(name)
            || (connection_lists && named_by_connection(headers, name))
        {
            continue;
        }
        put_header(dst, name.as_str(), value.as_bytes());
    }
}

/// What identifies a forward to its worker.
pub struct Forwarded<'a> {
    pub peer: IpAddr,
    pub epoch: &'a str,
    pub attestation: &'a [u8],
    /// `Some(protocol)` for an upgrade (`Upgrade` and `Connection: upgrade` are kept).
    pub upgrade: Option<&'a [u8]>,
    /// The request's id and trace context, written in place of the client's.
    pub correlation: &'a Correlation,
}

/// Writes the request head sent to the worker.
pub fn request_head(
    method: &Method,
    base: &str,
    path_and_query: &str,
    headers: &HeaderMap,
    forwarded: &Forwarded<'_>,
    framing: BodyFraming,
    dst: &mut BytesMut,
) {
    dst.put_slice(method.as_str().as_bytes());
    dst.put_u8(b' ');
    dst.put_slice(base.as_bytes());
    dst.put_slice(path_and_query.as_bytes());
    dst.put_slice(b" HTTP/1.1\r\n");
    let correlation = forwarded.correlation;
    let started_trace = correlation.started_trace();
    copy_end_to_end(
        headers,
        |name| {
            name == "x-forwarded-for"
                || name == REQUEST_ID
                || name == TRACEPARENT
                || (started_trace && name == TRACESTATE)
        },
        dst,
    );
    let _ = write!(dst.writer(), "x-forwarded-for: {}\r\n", forwarded.peer);
    put_header(dst, REQUEST_ID, correlation.request_id().as_bytes());
    put_header(dst, TRACEPARENT, correlation.traceparent().as_bytes());
    dst.put_slice(b"pinboard-epoch: ");
    dst.put_slice(forwarded.epoch.as_bytes());
    dst.put_slice(b"\r\npinboard-attestation: ");
    dst.put_slice(forwarded.attestation);
    dst.put_slice(b"\r\n");
    if let Some(protocol) = forwarded.upgrade {
        dst.put_slice(b"connection: upgrade\r\nupgrade: ");
        dst.put_slice(protocol);
        dst.put_slice(b"\r\n");
    }
    framing.encode(dst);
    dst.put_slice(b"\r\n");
}

fn put_header(dst: &mut BytesMut, name: &str, value: &[u8]) {
    dst.put_slice(name.as_bytes());
    dst.put_slice(b": ");
    dst.put_slice(value);
    dst.put_slice(b"\r\n");
}

/// Writes the response head relayed to the client, with the request's id in place of any the
/// worker sent.
pub fn response_head(
    status: StatusCode,
    headers: &HeaderMap,
    framing: BodyFraming,
    connection: crate::http::Persistence,
    request_id: &str,
    dst: &mut BytesMut,
) {
    crate::http::encode_status_line(status, dst);
    copy_end_to_end(headers, |name| name == REQUEST_ID, dst);
    put_header(dst, REQUEST_ID, request_id.as_bytes());
    if status == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(upgrade) = headers.get(header::UPGRADE) {
            dst.put_slice(b"connection: upgrade\r\nupgrade: ");
            dst.put_slice(upgrade.as_bytes());
            dst.put_slice(b"\r\n");
        }
    } else {
        connection.encode(dst);
    }
    dst.put_slice(b"x-accel-buffering: no\r\n");
    framing.encode(dst);
    dst.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn request_head_strips_and_adds() {
        let inbound = headers(&[
            ("host", "edge.example"),
            ("pinboard-epoch", "999"),
            ("pinboard-attestation", "forged"),
            ("pinboard_epoch", "999"),
            ("pinboard_attestation", "forged"),
            ("pinboardx", "kept: not a pinboard header"),
            ("x-forwarded-for", "1.2.3.4"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("content-length", "5"),
            ("accept", "a/b"),
            ("x-request-id", "client-id"),
            ("traceparent", "not a trace context"),
            ("tracestate", "vendor=1"),
        ]);
        let mut out = BytesMut::new();
        // The client's id is kept; its broken trace context is replaced by a new trace, and
        // its tracestate, which belongs to no trace of ours, is dropped.
        let correlation = Correlation::of(&inbound, || 0xab);
        let forwarded = Forwarded {
            peer: "127.0.0.9".parse().unwrap(),
            epoch: "42",
            attestation: b"tok",
            upgrade: None,
            correlation: &correlation,
        };
        request_head(
            &Method::POST,
            "/base",
            "/t/x?q=1",
            &inbound,
            &forwarded,
            BodyFraming::Length(5),
            &mut out,
        );
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "POST /base/t/x?q=1 HTTP/1.1\r\nhost: edge.example\r\n\
             pinboardx: kept: not a pinboard header\r\naccept: a/b\r\n\
             x-forwarded-for: 127.0.0.9\r\nx-request-id: client-id\r\n\
             traceparent: 00-000000000000000000000000000000ab-00000000000000ab-00\r\n\
             pinboard-epoch: 42\r\npinboard-attestation: tok\r\n\
             content-length: 5\r\n\r\n"
        );
    }

    /// The names `request_head` writes as literals (no header map on this path) are the
    /// protocol's.
    #[test]
    fn added_names_are_the_protocols() {
        use pinboard_protocol::header::{ATTESTATION, EPOCH};
        let correlation = Correlation::of(&HeaderMap::new(), || 1);
        let forwarded = Forwarded {
            peer: "127.0.0.9".parse().unwrap(),
            epoch: "42",
            attestation: b"tok",
            upgrade: None,
            correlation: &correlation,
        };
        let mut out = BytesMut::new();
        let (empty, none) = (HeaderMap::new(), BodyFraming::None);
        request_head(&Method::GET, "", "/t/x", &empty, &forwarded, none, &mut out);
        let out = std::str::from_utf8(&out).unwrap();
        assert!(out.contains(&format!("\r\n{EPOCH}: 42\r\n")), "{out}");
        assert!(
            out.contains(&format!("\r\n{ATTESTATION}: tok\r\n")),
            "{out}"
        );
    }

    #[test]
    fn response_head_strips_and_adds() {
        let upstream = headers(&[
            ("content-type", "text/plain"),
            ("pinboard-internal", "x"),
            ("pinned-refusal", "kept: not ours to judge here"),
            ("transfer-encoding", "chunked"),
            ("connection", "close"),
            ("x-request-id", "the worker's own"),
        ]);
        let mut out = BytesMut::new();
        response_head(
            StatusCode::OK,
            &upstream,
            BodyFraming::Chunked,
            crate::http::Persistence::Implicit,
            "req-1",
            &mut out,
        );
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\npinned-refusal: kept: not ours to judge here\r\n\
             x-request-id: req-1\r\nx-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }
}
