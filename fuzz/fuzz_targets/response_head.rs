//! `ResponseHeadDecoder`: a worker's answer heads, read by the forward (and by the node's calls
//! to workers) before any of it reaches a client.
//!
//! Input: byte 0 picks the head size cap (16 to 4080 in steps of 16, or 255 for 64 KiB, the
//! forward's), bytes 1-2 a split point, and the rest is what the worker sends. Beyond "no
//! panic", it checks that:
//! - the bytes arriving in two reads give the same head, leftover bytes or error as arriving
//!   in one;
//! - an accepted head is never larger than the cap, and ends where httparse ends it (the body
//!   behind it is never swallowed);
//! - differentially, monoio-http's decoder (which ours replaced) reads an accepted head alike
//!   (same status, version and fields);
//! - header maps are given back and reused (`recycle_headers`) across inputs, as on a core.
#![no_main]

#[path = "head_input.rs"]
mod head_input;

use bytes::BytesMut;
use head_input::{cap_split_wire, whole_and_split};
use http::{HeaderMap, StatusCode, Version};
use libfuzzer_sys::fuzz_target;
use monoio_codec::{Decoded, Decoder};
use monoio_http::h1::codec::decoder::ResponseHeadDecoder as Before;
use pinboard::http::{ResponseHeadDecoder, recycle_headers};

#[derive(Debug, PartialEq)]
enum Outcome {
    Head {
        status: StatusCode,
        version: Version,
        headers: HeaderMap,
    },
    Insufficient,
    Failed(String),
}

/// Decodes the bytes arriving as `reads`, as the forward does: asked again only while it wants
/// more bytes.
fn run(max: usize, reads: &[&[u8]]) -> (Outcome, BytesMut) {
    let mut decoder = ResponseHeadDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut outcome = Outcome::Insufficient;
    for read in reads {
        buf.extend_from_slice(read);
        if outcome == Outcome::Insufficient {
            outcome = match decoder.decode(&mut buf) {
                Ok(Decoded::Some(parts)) => Outcome::Head {
                    status: parts.status,
                    version: parts.version,
                    headers: parts.headers,
                },
                Ok(_) => Outcome::Insufficient,
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
        status,
        version,
        headers,
    } = whole
    else {
        return;
    };
    let consumed = wire.len() - leftover.len();
    assert!(
        consumed <= max,
        "accepted a {consumed}-byte head over the {max}-byte cap"
    );
    let mut parsed = [httparse::EMPTY_HEADER; 128];
    let mut response = httparse::Response::new(&mut parsed);
    assert_eq!(
        response.parse(&wire[..consumed]).ok(),
        Some(httparse::Status::Complete(consumed)),
        "the decoder consumed bytes past the end of the head"
    );

    let mut old = BytesMut::from(&wire[..consumed]);
    let Ok(Decoded::Some(before)) = Before.decode(&mut old) else {
        panic!("monoio-http's decoder refused a head ours accepted");
    };
    assert_eq!((before.status, before.version), (status, version));
    assert_eq!(before.headers, headers);
    recycle_headers(headers);
});
