//! `HeadDecoder`: request heads straight off the wire, the first code a client's bytes meet.
//!
//! Input: byte 0 picks the head size cap (16 to 4080 in steps of 16, or 255 for 64 KiB, the
//! largest `http.max_header_bytes` allows: past it monoio-http's decoder, the differential
//! check's reference, panics on a header name),
//! bytes 1-2 a split point, and the rest is what the client sends. Beyond "no panic", it
//! checks that:
//! - the bytes arriving in two reads give the same head, framing, leftover bytes or error as
//!   arriving in one (a client controls where its reads split);
//! - an accepted head is never larger than the cap;
//! - every byte consumed is part of the head (httparse finds the same end), so the bytes of a
//!   body or a pipelined request behind it are never swallowed;
//! - framing is unambiguous: no accepted head has both Transfer-Encoding and Content-Length,
//!   and none is chunked under HTTP/1.0;
//! - differentially, monoio-http's decoder (which ours replaced) reads an accepted head alike:
//!   same method, version and fields (and target, but where an absolute-form one became
//!   `Host`); a head it reads that ours refuses as malformed is refused by one of our rules
//!   after the parse, never by the parse;
//! - header maps are given back and reused (`recycle_headers`) across inputs, as on a core.
#![no_main]

#[path = "head_input.rs"]
mod head_input;

use bytes::BytesMut;
use head_input::{cap_split_wire, whole_and_split};
use http::{HeaderMap, Method, Uri, Version, header};
use libfuzzer_sys::fuzz_target;
use monoio_codec::{Decoded, Decoder};
use monoio_http::h1::codec::decoder::RequestHeadDecoder;
use pinboard::http::{Framing, HeadDecoder, HeadError, recycle_headers};

/// What one decode call yields, in a form two runs can be compared by.
#[derive(Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "two exist per input: boxing would buy nothing"
)]
enum Outcome {
    Head {
        method: Method,
        uri: Uri,
        version: Version,
        headers: HeaderMap,
        framing: Framing,
    },
    Insufficient,
    Failed(String),
}

/// Decodes the bytes arriving as `reads`; returns the outcome of the decode that ended it and the
/// bytes left buffered once everything has arrived.
fn run(max: usize, reads: &[&[u8]]) -> (Outcome, BytesMut) {
    let mut decoder = HeadDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut outcome = Outcome::Insufficient;
    for read in reads {
        buf.extend_from_slice(read);
        // Like monoio's FramedRead: the decoder is asked again only while it wants more bytes.
        if outcome == Outcome::Insufficient {
            outcome = match decoder.decode(&mut buf) {
                Ok(Decoded::Some((parts, framing))) => Outcome::Head {
                    method: parts.method,
                    uri: parts.uri,
                    version: parts.version,
                    headers: parts.headers,
                    framing,
                },
                Ok(Decoded::Insufficient | Decoded::InsufficientAtLeast(_)) => {
                    Outcome::Insufficient
                }
                Err(e) => Outcome::Failed(e.to_string()),
            };
        }
    }
    (outcome, buf)
}

fuzz_target!(|data: &[u8]| {
    let Some((max, split, wire)) = cap_split_wire(data) else {
        return;
    };

    let (whole, leftover, parted) = whole_and_split(wire, split, |reads| run(max, reads));

    if let Outcome::Head { headers, .. } = parted {
        recycle_headers(headers);
    }
    let Outcome::Head {
        method,
        uri,
        version,
        headers,
        framing,
    } = whole
    else {
        if let Outcome::Failed(why) = &whole {
            refused_after_the_parse(max, wire, why);
        }
        return;
    };
    let consumed = wire.len() - leftover.len();
    assert!(
        consumed <= max,
        "accepted a {consumed}-byte head over the {max}-byte cap"
    );

    // An independent parse of exactly the consumed bytes must end where they end.
    let mut parsed = [httparse::EMPTY_HEADER; 128];
    let mut request = httparse::Request::new(&mut parsed);
    assert_eq!(
        request.parse(&wire[..consumed]).ok(),
        Some(httparse::Status::Complete(consumed)),
        "the decoder consumed bytes past the end of the head"
    );

    assert!(
        !(headers.contains_key(header::TRANSFER_ENCODING)
            && headers.contains_key(header::CONTENT_LENGTH)),
        "accepted both Transfer-Encoding and Content-Length"
    );
    if framing == Framing::Chunked {
        assert_ne!(version, Version::HTTP_10, "chunked framing in HTTP/1.0");
    }

    let mut old = BytesMut::from(&wire[..consumed]);
    let Ok(Decoded::Some(before)) = RequestHeadDecoder.decode(&mut old) else {
        panic!("monoio-http's decoder refused a head ours accepted");
    };
    assert_eq!(before.method, method);
    assert_eq!(before.version, version);
    if before.uri.authority().is_none() {
        assert_eq!(before.uri, uri);
        assert_eq!(before.headers, headers);
    } else {
        let mut before = before.headers;
        let mut ours = headers.clone();
        before.remove(header::HOST);
        ours.remove(header::HOST);
        assert_eq!(before, ours);
    }
    recycle_headers(headers);
});

/// What our parse may refuse that monoio-http's read: nothing. A head it reads (whole, within
/// the cap, every line ending in CRLF) that we refuse is refused by a rule after the parse.
fn refused_after_the_parse(max: usize, wire: &[u8], why: &str) {
    let window = &wire[..wire.len().min(max)];
    let Some(end) = memchr_crlfcrlf(window) else {
        return;
    };
    let head = &window[..end];
    if head
        .iter()
        .enumerate()
        .any(|(i, b)| *b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
    {
        return;
    }
    let mut old = BytesMut::from(head);
    if !matches!(RequestHeadDecoder.decode(&mut old), Ok(Decoded::Some(_))) {
        return;
    }
    let after_the_parse = [
        "repeated host",
        "authority-form target",
        "absolute-form target of another scheme",
        "userinfo in the target",
        "invalid target authority",
        "invalid target",
        "both transfer-encoding and content-length",
        "transfer-encoding in an HTTP/1.0 request",
        "repeated content-length",
        "invalid content-length",
    ]
    .map(|rule| HeadError::Malformed(rule.into()).to_string());
    assert!(
        why == HeadError::UnsupportedEncoding.to_string()
            || after_the_parse.contains(&why.to_owned()),
        "monoio-http's decoder read a head ours refused: {why}"
    );
}

fn memchr_crlfcrlf(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}
