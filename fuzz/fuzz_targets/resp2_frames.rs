//! RESP2 replies as `pinboard::redis` reads them off a Redis connection: its `decode_reply`
//! (the nesting and size bounds in front of redis-protocol's range decoder, then the copy into
//! `Reply`), driven the way its reader does: decode replies while whole ones are buffered, read
//! more otherwise.
//!
//! Input: bytes 0-1 are a split point, and the rest is what the server sends. Beyond "no
//! panic" (and no stack overflow: a reply nested without bound must be refused, not recursed
//! into), it checks that the bytes arriving in two reads give the same replies, the same refusal
//! and the same leftover bytes as arriving in one.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pinboard::redis::{RedisError, Reply, decode_reply};

/// Everything decoded once all `reads` have arrived: the replies (or the server's error
/// replies), whether the stream was refused (the connection dropped: which check refused it
/// first may depend on how much had arrived), and the bytes still buffered.
type Decoded = (Vec<Result<Reply, RedisError>>, bool, BytesMut);

fn run(reads: &[&[u8]]) -> Decoded {
    let mut buf = BytesMut::new();
    let mut replies = Vec::new();
    let mut refused = false;
    for read in reads {
        buf.extend_from_slice(read);
        while !refused {
            let before = buf.len();
            match decode_reply(&mut buf) {
                Ok(Some(reply)) => {
                    assert!(buf.len() < before, "a reply consumed no bytes");
                    replies.push(reply);
                }
                Ok(None) => break,
                Err(_) => refused = true,
            }
        }
    }
    (replies, refused, buf)
}

fuzz_target!(|data: &[u8]| {
    let [hi, lo, wire @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_be_bytes([*hi, *lo])) % (wire.len() + 1);
    assert_eq!(
        run(&[wire]),
        run(&[&wire[..split], &wire[split..]]),
        "split at {split} changed what was decoded"
    );
});
