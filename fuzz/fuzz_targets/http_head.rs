//! `HeadDecoder`: request heads straight off the wire, the first code a client's bytes meet.
//!
//! Input: byte 0 picks the head size cap (16 to 4080 in steps of 16, or 255 for 64 KiB, the
//! largest `http.max_header_bytes` allows: past it the http crate panics on a header name),
//! bytes 1-2 a split point, and the rest is what the client sends. Beyond "no panic", it
//! checks that:
//! - the bytes arriving in two reads give the same head, framing, leftover bytes or error as
//!   arriving in one (a client controls where its reads split);
//! - an accepted head is never larger than the cap;
//! - every byte consumed is part of the head (httparse finds the same end), so the bytes of a
//!   body or a pipelined request behind it are never swallowed;
//! - framing is unambiguous: no accepted head has both Transfer-Encoding and Content-Length,
//!   and none is chunked under HTTP/1.0.
#![no_main]

use bytes::BytesMut;
use http::{HeaderMap, Method, Uri, Version, header};
use libfuzzer_sys::fuzz_target;
use monoio_codec::{Decoded, Decoder};
use pinboard::http::{Framing, HeadDecoder};

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
    let [cap, hi, lo, wire @ ..] = data else {
        return;
    };
    let max = match cap {
        255 => 64 * 1024,
        small => 16 * (usize::from(*small) + 1),
    };
    let split = usize::from(u16::from_be_bytes([*hi, *lo])) % (wire.len() + 1);

    let (whole, leftover) = run(max, &[wire]);
    let (parted, parted_leftover) = run(max, &[&wire[..split], &wire[split..]]);
    assert_eq!(whole, parted, "split at {split} changed the outcome");
    assert_eq!(
        leftover, parted_leftover,
        "split at {split} changed the leftover"
    );

    let Outcome::Head {
        version,
        headers,
        framing,
        ..
    } = whole
    else {
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
});
