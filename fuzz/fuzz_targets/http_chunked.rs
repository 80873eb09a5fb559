//! `ChunkedDecoder`: `Transfer-Encoding: chunked` request bodies, streamed as they arrive.
//!
//! Input: bytes 0-3 are two split points, and the rest is the body as the client sends it.
//! Beyond "no panic", it checks that:
//! - the bytes arriving in three reads give the same data, the same ending (complete, malformed
//!   or wanting more) and the same leftover bytes as arriving in one;
//! - the data handed out never outgrows the bytes consumed (framing only ever shrinks);
//! - no data piece is empty (a reader could take one for the end of the stream);
//! - once complete, the decoder keeps answering `End` and leaves the bytes behind the body (a
//!   pipelined request) alone.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pinboard::http::{ChunkedDecoder, Malformed, Piece};

#[derive(Debug, PartialEq)]
enum Ending {
    Complete,
    Malformed,
    WantsMore,
}

/// Everything a body's decoding produced once all `reads` have arrived.
struct Run {
    decoder: ChunkedDecoder,
    data: Vec<u8>,
    ending: Ending,
    leftover: BytesMut,
}

fn run(reads: &[&[u8]]) -> Run {
    let mut decoder = ChunkedDecoder::default();
    let mut leftover = BytesMut::new();
    let mut data = Vec::new();
    let mut ending = Ending::WantsMore;
    for read in reads {
        leftover.extend_from_slice(read);
        // As the server does: drain all it can after each read, stop at the end or an error.
        while ending == Ending::WantsMore {
            match decoder.decode(&mut leftover) {
                Ok(Some(Piece::Data(piece))) => {
                    assert!(!piece.is_empty(), "an empty data piece");
                    data.extend_from_slice(&piece);
                }
                Ok(Some(Piece::End)) => ending = Ending::Complete,
                Ok(None) => break,
                Err(Malformed) => ending = Ending::Malformed,
            }
        }
    }
    Run {
        decoder,
        data,
        ending,
        leftover,
    }
}

fuzz_target!(|data: &[u8]| {
    let [a0, a1, b0, b1, wire @ ..] = data else {
        return;
    };
    let point = |hi: u8, lo: u8| usize::from(u16::from_be_bytes([hi, lo])) % (wire.len() + 1);
    let (a, b) = (point(*a0, *a1), point(*b0, *b1));
    let (first, second) = (a.min(b), a.max(b));

    let mut whole = run(&[wire]);
    let parted = run(&[&wire[..first], &wire[first..second], &wire[second..]]);
    let splits = format!("split at {first} and {second}");
    assert_eq!(whole.ending, parted.ending, "{splits} changed the ending");
    assert_eq!(whole.data, parted.data, "{splits} changed the data");
    assert_eq!(
        whole.leftover, parted.leftover,
        "{splits} changed the leftover"
    );

    let consumed = wire.len() - whole.leftover.len();
    assert!(
        whole.data.len() <= consumed,
        "{} bytes of data out of {consumed} bytes consumed",
        whole.data.len()
    );

    if whole.ending == Ending::Complete {
        let behind = whole.leftover.clone();
        assert_eq!(
            whole.decoder.decode(&mut whole.leftover),
            Ok(Some(Piece::End))
        );
        assert_eq!(
            whole.leftover, behind,
            "bytes behind a finished body were consumed"
        );
    }
});
