//! The forward's framing: for any request head `HeadDecoder` accepts, the head Pinboard writes
//! to the worker (`proxy::request_head`, given the framing the decoder decided) is exactly one
//! request whose body is delimited the same way — the property that closes request smuggling
//! through the node (issue 8, C1: a list-form `Content-Length` read as 49 by the decoder and as
//! nothing by the forward).
//!
//! Input: byte 0 picks the head size cap (as `http_head`), then the client's bytes. Checks, by
//! an independent parse (httparse) of what goes upstream:
//! - it is one complete head that ends where the written bytes end (nothing of the client's
//!   bytes can turn into a second request);
//! - it carries exactly the framing decided: one `content-length` equal to the decided length,
//!   or one `transfer-encoding: chunked`, or neither when there is no body;
//! - no client `Pinboard-*` header, and exactly one `pinboard-epoch` and one
//!   `pinboard-attestation`, the node's own.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use monoio_codec::{Decoded, Decoder};
use pinboard::correlation::Correlation;
use pinboard::http::{BodyFraming, Framing, HeadDecoder};
use pinboard::proxy::{Forwarded, request_head};

fuzz_target!(|data: &[u8]| {
    let [cap, wire @ ..] = data else {
        return;
    };
    let max = 16 * (usize::from(*cap) + 1);
    let mut buf = BytesMut::from(wire);
    let Ok(Decoded::Some((head, framing))) = HeadDecoder::new(max).decode(&mut buf) else {
        return;
    };
    // The client's X-Request-Id and traceparent, whatever bytes they hold, are read here.
    let correlation = Correlation::of(&head.headers, || 7);
    let forwarded = Forwarded {
        peer: "127.0.0.1".parse().unwrap(),
        from_trusted_proxy: false,
        scheme: "http",
        epoch: "1700000000001",
        attestation: b"token",
        upgrade: None,
        correlation: &correlation,
        drop_authorization: false,
    };
    let path = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
    // Only an origin-form target reaches a forward (`OPTIONS *` and the like are answered by the
    // node's routes); the writer refuses any other.
    if !path.starts_with('/') {
        return;
    }
    let mut out = BytesMut::new();
    request_head(
        &head.method,
        "",
        path,
        &head.headers,
        &forwarded,
        BodyFraming::from(framing),
        &mut out,
    )
    .expect("every head the decoder accepts can be forwarded");

    let mut parsed = [httparse::EMPTY_HEADER; 256];
    let mut upstream = httparse::Request::new(&mut parsed);
    assert_eq!(
        upstream.parse(&out).ok(),
        Some(httparse::Status::Complete(out.len())),
        "the upstream head is not one complete head: {:?}",
        String::from_utf8_lossy(&out)
    );
    let named = |name: &str| {
        upstream
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect::<Vec<_>>()
    };
    let lengths = named("content-length");
    let codings = named("transfer-encoding");
    match framing {
        Framing::None => assert!(lengths.is_empty() && codings.is_empty()),
        Framing::Length(n) => {
            assert_eq!(lengths, [n.to_string().as_bytes()]);
            assert!(codings.is_empty());
        }
        Framing::Chunked => {
            assert_eq!(codings, [b"chunked".as_slice()]);
            assert!(lengths.is_empty());
        }
    }
    for h in upstream.headers.iter() {
        let lower = h.name.to_ascii_lowercase();
        if lower.starts_with("pinboard-") || lower.starts_with("pinboard_") {
            assert!(
                lower == "pinboard-epoch" || lower == "pinboard-attestation",
                "a client's {lower} reached the worker"
            );
        }
    }
    assert_eq!(named("pinboard-epoch").len(), 1);
    assert_eq!(named("pinboard-attestation").len(), 1);
    // One id and one trace context reach the worker: ours (the client's, when usable).
    assert_eq!(named("x-request-id"), [correlation.request_id().as_bytes()]);
    assert_eq!(named("traceparent"), [correlation.traceparent().as_bytes()]);
    assert_eq!(correlation.traceparent().len(), 55);
});
