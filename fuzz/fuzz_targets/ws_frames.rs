//! `FrameBoundaries`: where the frames of a tunnelled WebSocket stream end, read as the bytes
//! pass (the node's close frame at the end of the shutdown grace goes at one of them).
//!
//! Input: byte 0 is the size of the pieces the stream arrives in (`b + 1`), bytes 1-2 one more
//! split point; the rest is the stream as the worker sends it. Beyond "no panic", it checks that:
//! - the stream arriving in pieces gives the same boundaries, and the same end state (at a
//!   boundary or not, a Close seen or not), as arriving in one;
//! - those boundaries are the ones a plain walk over the whole stream finds (each frame: a
//!   2-14 byte header, then the payload length it declares; no boundary past a 64-bit length
//!   with its top bit set);
//! - `step` never takes more than it is given, and takes something from any non-empty input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinboard::http::FrameBoundaries;

/// The boundaries (offsets) of `pieces` read one after another, and the tracker after them.
fn read(pieces: &[&[u8]]) -> (Vec<usize>, FrameBoundaries) {
    let mut frames = FrameBoundaries::default();
    let mut found = Vec::new();
    let mut offset = 0;
    for piece in pieces {
        let mut taken = 0;
        while taken < piece.len() {
            let step = frames.step(&piece[taken..]);
            assert!(step > 0, "took nothing of {} bytes", piece.len() - taken);
            taken += step;
            assert!(taken <= piece.len(), "took more than given");
            if frames.at_boundary() {
                found.push(offset + taken);
            }
        }
        offset += piece.len();
    }
    (found, frames)
}

/// The frame ends of the whole `stream`, walked frame by frame; and whether it holds a whole
/// Close header.
fn walk(stream: &[u8]) -> (Vec<usize>, bool) {
    let (mut ends, mut closed, mut at) = (Vec::new(), false, 0usize);
    loop {
        let (Some(&first), Some(&second)) = (stream.get(at), stream.get(at + 1)) else {
            return (ends, closed);
        };
        let (extra, mask) = match second & 0x7F {
            126 => (2, second >> 7),
            127 => (8, second >> 7),
            _ => (0, second >> 7),
        };
        let header = 2 + extra + 4 * usize::from(mask);
        let Some(head) = stream.get(at..at + header) else {
            return (ends, closed);
        };
        closed |= first & 0x0F == 0x8;
        let len = match extra {
            2 => u64::from(u16::from_be_bytes([head[2], head[3]])),
            8 => {
                let len = u64::from_be_bytes(head[2..10].try_into().unwrap());
                if len >> 63 == 1 {
                    return (ends, closed);
                }
                len
            }
            _ => u64::from(second & 0x7F),
        };
        let end = (at + header) as u64 + len;
        if end > stream.len() as u64 {
            return (ends, closed);
        }
        at = end as usize;
        ends.push(at);
    }
}

fuzz_target!(|data: &[u8]| {
    let [size, s0, s1, stream @ ..] = data else {
        return;
    };
    let size = usize::from(*size) + 1;
    let split = usize::from(u16::from_be_bytes([*s0, *s1])) % (stream.len() + 1);
    let (head, tail) = stream.split_at(split);
    let mut pieces: Vec<&[u8]> = head.chunks(size).collect();
    pieces.extend(tail.chunks(size));

    let (whole, one) = read(&[stream]);
    let (parted, many) = read(&pieces);
    assert_eq!(
        whole, parted,
        "pieces of {size} split at {split} moved a boundary"
    );
    assert_eq!(
        one, many,
        "pieces of {size} split at {split} changed the end state"
    );

    let (ends, closed) = walk(stream);
    assert_eq!(whole, ends, "not where the frames' lengths put them");
    assert_eq!(one.closed(), closed, "a Close header seen or not");
    let at_end = stream.is_empty() || ends.last() == Some(&stream.len());
    assert_eq!(one.at_boundary(), at_end, "the end of the stream");
});
