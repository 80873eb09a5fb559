//! RESP2 replies as `pinboard::redis` reads them off a Redis connection.
//!
//! Pinboard's own entry point, `redis::connection::decode_reply`, is crate-private, so this
//! target drives the call it wraps, `redis_protocol::resp2::decode::decode_bytes_mut`, the way
//! its `ReplyReader` does: decode replies while whole ones are buffered, read more otherwise.
//!
//! Input: bytes 0-1 are a split point, and the rest is what the server sends. Beyond "no
//! panic", it checks that the bytes arriving in two reads give the same replies, the same error
//! and the same leftover bytes as arriving in one, and that each reply consumes exactly the
//! bytes it reports.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;

/// Everything decoded once all `reads` have arrived: the replies, the error that would drop the
/// connection (if any), and the bytes still buffered.
fn run(reads: &[&[u8]]) -> (Vec<BytesFrame>, Option<String>, BytesMut) {
    let mut buf = BytesMut::new();
    let mut replies = Vec::new();
    let mut error = None;
    for read in reads {
        buf.extend_from_slice(read);
        while error.is_none() {
            let before = buf.len();
            match decode_bytes_mut(&mut buf) {
                Ok(Some((frame, amt, raw))) => {
                    assert_eq!(
                        raw.len(),
                        amt,
                        "a reply's bytes are not its reported length"
                    );
                    assert_eq!(
                        buf.len() + amt,
                        before,
                        "a reply consumed other than its bytes"
                    );
                    replies.push(frame);
                }
                Ok(None) => break,
                Err(e) => error = Some(e.to_string()),
            }
        }
    }
    (replies, error, buf)
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
