//! Header rewriting at both edges of a forward, written straight into the connection's output
//! buffer (no intermediate header map, nothing allocated per request):
//!
//! - towards the worker: every inbound `Pinboard-*` header stripped, hop-by-hop headers (and
//!   every end-to-end extra `Connection` names, never `Host`) dropped, `Authorization` dropped
//!   when the data-plane passport consumed it, `X-Forwarded-For` replaced by the observed peer,
//!   the client's `Forwarded`, `X-Forwarded-Proto`, `X-Forwarded-Host` and `X-Real-IP` dropped
//!   unless the peer is a trusted proxy, `X-Forwarded-Proto` and `X-Forwarded-Host` stated
//!   where they were dropped or never sent, `Pinboard-Epoch` and `Pinboard-Attestation` added,
//!   framing restated;
//! - towards the client: `Pinboard-*` and hop-by-hop headers dropped, `X-Accel-Buffering: no`
//!   added, framing restated.
//!
//! Every field goes through [`HeadWriter`], which refuses a value with CR, LF, NUL or another
//! control byte: a head that cannot be written whole is not written at all ([`Unwritable`]).

use std::net::IpAddr;

use bytes::BytesMut;
use http::{HeaderMap, HeaderName, Method, StatusCode, header};

use pinboard_protocol::header::{ATTESTATION, EPOCH};

use crate::correlation::{Correlation, REQUEST_ID, TRACEPARENT, TRACESTATE};
use crate::http::{BodyFraming, HeadWriter, Unwritable};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

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

/// Copies every end-to-end header but those `skip` names. A header `Connection` lists is
/// hop-by-hop, except `Host`: the request's target, by which the node placed it, is never the
/// client's to drop (issue 23, L6). The headers the node decides itself (framing, identity,
/// `X-Forwarded-For`, `Pinboard-*`) are never copied, so `Connection` cannot remove them either.
fn copy_end_to_end(
    headers: &HeaderMap,
    skip: impl Fn(&HeaderName) -> bool,
    head: &mut HeadWriter<'_>,
) -> Result<(), Unwritable> {
    let connection_lists = headers.contains_key(header::CONNECTION);
    for (name, value) in headers {
        if hop_by_hop(name)
            || is_pinboard(name)
            || skip(name)
            || (connection_lists && name != header::HOST && named_by_connection(headers, name))
        {
            continue;
        }
        head.field(name, value.as_bytes())?;
    }
    Ok(())
}

/// What a client says of where its request came from, which only a trusted proxy may say:
/// believed from anyone else, it would tell the worker a scheme, host or address the node never
/// saw.
fn says_where_from(name: &HeaderName) -> bool {
    name == header::FORWARDED
        || name == X_FORWARDED_PROTO
        || name == X_FORWARDED_HOST
        || name == "x-real-ip"
}

/// What identifies a forward to its worker.
pub struct Forwarded<'a> {
    pub peer: IpAddr,
    /// The peer is one of `trusted_proxies`: what it says of where the request came from
    /// (`Forwarded`, `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Real-IP`) is passed on.
    pub from_trusted_proxy: bool,
    /// The scheme the request came by, stated as `X-Forwarded-Proto`.
    pub scheme: &'a str,
    pub epoch: &'a str,
    pub attestation: &'a [u8],
    /// `Some(protocols)` for an upgrade the node tunnels (`Upgrade`, with only the protocols
    /// `forwards.upgrade_protocols` allows, and `Connection: upgrade` are written).
    pub upgrade: Option<&'a [u8]>,
    /// The request's id and trace context, written in place of the client's.
    pub correlation: &'a Correlation,
    /// The client's `Authorization` is left out: the data-plane passport consumed it, and the
    /// worker has the identity in the attestation's `acct` (unless
    /// `forwards.keep_authorization`).
    pub drop_authorization: bool,
}

/// Writes the request head sent to the worker after what `dst` holds; on [`Unwritable`],
/// nothing of it stays.
pub fn request_head(
    method: &Method,
    base: &str,
    path_and_query: &str,
    headers: &HeaderMap,
    forwarded: &Forwarded<'_>,
    framing: BodyFraming,
    dst: &mut BytesMut,
) -> Result<(), Unwritable> {
    let mut head = HeadWriter::request(dst, method, base, path_and_query)?;
    let correlation = forwarded.correlation;
    let started_trace = correlation.started_trace();
    copy_end_to_end(
        headers,
        |name| {
            name == "x-forwarded-for"
                || name == REQUEST_ID
                || name == TRACEPARENT
                || (started_trace && name == TRACESTATE)
                || (forwarded.drop_authorization && name == header::AUTHORIZATION)
                || (!forwarded.from_trusted_proxy && says_where_from(name))
        },
        &mut head,
    )?;
    head.field_display(&X_FORWARDED_FOR, forwarded.peer)?;
    let passed_on = |name: &HeaderName| forwarded.from_trusted_proxy && headers.contains_key(name);
    if !passed_on(&X_FORWARDED_PROTO) {
        head.field(&X_FORWARDED_PROTO, forwarded.scheme.as_bytes())?;
    }
    if let Some(host) = headers.get(header::HOST)
        && !passed_on(&X_FORWARDED_HOST)
    {
        head.field(&X_FORWARDED_HOST, host.as_bytes())?;
    }
    head.header(REQUEST_ID, correlation.request_id().as_bytes())?;
    head.header(TRACEPARENT, correlation.traceparent().as_bytes())?;
    head.field(&EPOCH, forwarded.epoch.as_bytes())?;
    head.field(&ATTESTATION, forwarded.attestation)?;
    if let Some(protocols) = forwarded.upgrade {
        head.field(&header::CONNECTION, b"upgrade")?;
        head.field(&header::UPGRADE, protocols)?;
    }
    head.framing(framing)?;
    head.finish()
}

/// The fields of the answer relayed to the client (its status line or pseudo-header, its
/// framing and the connection's persistence are the answer's writer's): the worker's end-to-end
/// fields, the request's id in place of any the worker sent, and on a `101` the protocol
/// switched to. On [`Unwritable`] (a worker's field no head may carry), nothing of it stays.
pub fn response_fields(
    status: StatusCode,
    headers: &HeaderMap,
    request_id: &str,
    head: &mut HeadWriter<'_>,
) -> Result<(), Unwritable> {
    copy_end_to_end(headers, |name| name == REQUEST_ID, head)?;
    head.header(REQUEST_ID, request_id.as_bytes())?;
    if status == StatusCode::SWITCHING_PROTOCOLS
        && let Some(upgrade) = headers.get(header::UPGRADE)
    {
        head.field(&header::CONNECTION, b"upgrade")?;
        head.field(&header::UPGRADE, upgrade.as_bytes())?;
    }
    head.field(&X_ACCEL_BUFFERING, b"no")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Persistence, answer_head};

    /// A forward from 127.0.0.9, an untrusted peer, over plain HTTP.
    fn plain<'a>(correlation: &'a Correlation, epoch: &'a str, drop: bool) -> Forwarded<'a> {
        Forwarded {
            peer: "127.0.0.9".parse().unwrap(),
            from_trusted_proxy: false,
            scheme: "http",
            epoch,
            attestation: b"tok",
            upgrade: None,
            correlation,
            drop_authorization: drop,
        }
    }

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
        let forwarded = plain(&correlation, "42", false);
        request_head(
            &Method::POST,
            "/base",
            "/t/x?q=1",
            &inbound,
            &forwarded,
            BodyFraming::Length(5),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "POST /base/t/x?q=1 HTTP/1.1\r\nhost: edge.example\r\n\
             pinboardx: kept: not a pinboard header\r\naccept: a/b\r\n\
             x-forwarded-for: 127.0.0.9\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: edge.example\r\nx-request-id: client-id\r\n\
             traceparent: 00-000000000000000000000000000000ab-00000000000000ab-00\r\n\
             pinboard-epoch: 42\r\npinboard-attestation: tok\r\n\
             content-length: 5\r\n\r\n"
        );
    }

    /// The head `request_head` writes after `before`, or its refusal (and what `dst` holds).
    fn forward_of(
        inbound: &HeaderMap,
        drop_authorization: bool,
        epoch: &str,
    ) -> Result<String, (Unwritable, BytesMut)> {
        let correlation = Correlation::of(inbound, || 1);
        let forwarded = plain(&correlation, epoch, drop_authorization);
        let mut out = BytesMut::from(&b"before"[..]);
        let none = BodyFraming::None;
        match request_head(
            &Method::GET,
            "",
            "/t/x",
            inbound,
            &forwarded,
            none,
            &mut out,
        ) {
            Ok(()) => Ok(String::from_utf8(out.to_vec()).unwrap()),
            Err(e) => Err((e, out)),
        }
    }

    /// L6 of issue 23: `Connection: host` dropped the Host the node placed the request by. A
    /// header `Connection` names is dropped only when it is an end-to-end extra.
    #[test]
    fn connection_cannot_drop_host_or_what_the_node_writes() {
        let inbound = headers(&[
            ("host", "edge.example"),
            (
                "connection",
                "host, x-forwarded-for, x-request-id, traceparent, pinboard-epoch, x-extra",
            ),
            ("x-extra", "1"),
            ("x-request-id", "rid"),
        ]);
        let out = forward_of(&inbound, false, "42").unwrap();
        for kept in [
            "\r\nhost: edge.example\r\n",
            "\r\nx-forwarded-for: 127.0.0.9\r\n",
            "\r\nx-request-id: rid\r\n",
            "\r\ntraceparent: ",
            "\r\npinboard-epoch: 42\r\n",
        ] {
            assert!(out.contains(kept), "{kept:?} missing from {out}");
        }
        assert!(!out.contains("x-extra"), "{out}");
    }

    /// What a client says of where its request came from reaches the worker only from a
    /// trusted proxy; the node states the scheme and host it saw where nobody trusted did.
    #[test]
    fn forwarding_headers_are_believed_from_trusted_proxies_only() {
        let inbound = headers(&[
            ("host", "edge.example"),
            ("forwarded", "for=6.6.6.6;proto=https;host=bank.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "bank.example"),
            ("x-real-ip", "6.6.6.6"),
        ]);
        let correlation = Correlation::of(&inbound, || 1);
        let write = |forwarded: &Forwarded<'_>| {
            let mut out = BytesMut::new();
            let none = BodyFraming::None;
            request_head(
                &Method::GET,
                "",
                "/t/x",
                &inbound,
                forwarded,
                none,
                &mut out,
            )
            .unwrap();
            String::from_utf8(out.to_vec()).unwrap()
        };
        let untrusted = write(&plain(&correlation, "1", false));
        for dropped in [
            "forwarded:",
            "6.6.6.6",
            "bank.example",
            "https",
            "x-real-ip",
        ] {
            assert!(!untrusted.contains(dropped), "{dropped} in {untrusted}");
        }
        assert!(
            untrusted.contains("\r\nx-forwarded-proto: http\r\n"),
            "{untrusted}"
        );
        assert!(untrusted.contains("\r\nx-forwarded-host: edge.example\r\n"));
        let tls = write(&Forwarded {
            scheme: "https",
            ..plain(&correlation, "1", false)
        });
        assert!(tls.contains("\r\nx-forwarded-proto: https\r\n"), "{tls}");
        let behind = write(&Forwarded {
            from_trusted_proxy: true,
            ..plain(&correlation, "1", false)
        });
        for kept in [
            "\r\nforwarded: for=6.6.6.6;proto=https;host=bank.example\r\n",
            "\r\nx-forwarded-proto: https\r\n",
            "\r\nx-forwarded-host: bank.example\r\n",
            "\r\nx-real-ip: 6.6.6.6\r\n",
        ] {
            assert!(behind.contains(kept), "{kept:?} missing from {behind}");
        }
        assert_eq!(behind.matches("x-forwarded-proto").count(), 1, "{behind}");
        assert_eq!(behind.matches("x-forwarded-host").count(), 1, "{behind}");
        // A trusted proxy that said nothing: the node states what it saw.
        let quiet = headers(&[("host", "edge.example")]);
        let mut out = BytesMut::new();
        let forwarded = Forwarded {
            from_trusted_proxy: true,
            ..plain(&correlation, "1", false)
        };
        request_head(
            &Method::GET,
            "",
            "/",
            &quiet,
            &forwarded,
            BodyFraming::None,
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out.to_vec()).unwrap();
        assert!(out.contains("\r\nx-forwarded-proto: http\r\nx-forwarded-host: edge.example\r\n"));
    }

    /// L7 of issue 23: the credential the data-plane passport consumed stays at the node.
    #[test]
    fn authorization_is_dropped_when_the_passport_consumed_it() {
        let inbound = headers(&[("host", "h"), ("authorization", "Bearer secret")]);
        assert!(
            !forward_of(&inbound, true, "1")
                .unwrap()
                .contains("authorization")
        );
        assert!(
            forward_of(&inbound, false, "1")
                .unwrap()
                .contains("\r\nauthorization: Bearer secret\r\n")
        );
    }

    /// M1 of issue 23: a value with a line end is never written, and nothing of the head is
    /// left behind.
    #[test]
    fn an_unwritable_value_leaves_nothing() {
        let inbound = headers(&[("host", "h")]);
        for epoch in ["1\r\nX-Injected: yes", "1\n", "\0"] {
            let (refused, out) = forward_of(&inbound, false, epoch).unwrap_err();
            assert_eq!(refused, Unwritable("header value"));
            assert_eq!(&out[..], b"before");
        }
        let upstream = headers(&[("x-ok", "1")]);
        let mut out = BytesMut::from(&b"before"[..]);
        let (ok, none, implicit) = (StatusCode::OK, BodyFraming::None, Persistence::Implicit);
        let written = answer_head(&mut out, ok, none, implicit, |fields| {
            response_fields(ok, &upstream, "a\rb", fields)
        });
        assert!(written.is_err());
        assert_eq!(&out[..], b"before");
    }

    /// The names `request_head` writes as literals (no header map on this path) are the
    /// protocol's.
    #[test]
    fn added_names_are_the_protocols() {
        let correlation = Correlation::of(&HeaderMap::new(), || 1);
        let forwarded = plain(&correlation, "42", false);
        let mut out = BytesMut::new();
        let (empty, none) = (HeaderMap::new(), BodyFraming::None);
        request_head(&Method::GET, "", "/t/x", &empty, &forwarded, none, &mut out).unwrap();
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
        let (ok, chunked) = (StatusCode::OK, BodyFraming::Chunked);
        answer_head(&mut out, ok, chunked, Persistence::Implicit, |fields| {
            response_fields(ok, &upstream, "req-1", fields)
        })
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\npinned-refusal: kept: not ours to judge here\r\n\
             x-request-id: req-1\r\nx-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }
}
