//! RESP2 framing over one connection's byte stream (plain TCP, or TLS over it: a
//! `pinboard_http::Transport`): command encoding, reply decoding, and a plain request/response
//! `Connection` used for the login and cluster discovery before a stream is handed to the
//! pipelined `Node`. Opening the stream is the login's (`login`).

use std::io;

use bytes::{Buf, BufMut, BytesMut};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable};
use pinboard_http::Transport;
use redis_protocol::resp2::decode::decode_range;
use redis_protocol::resp2::types::RangeFrame;

use super::{Blob, RedisError, Reply};

/// Spare room guaranteed before each socket read; replies larger than this arrive over several
/// reads.
const READ_CHUNK: usize = 16 * 1024;

/// Appends one command (a RESP array of bulk strings) to `buf`. The arguments are the
/// concatenation of `parts`, so callers can splice a fixed head, keys and arguments together
/// without first collecting them into a new Vec.
///
/// Encoded by hand rather than with redis-protocol's encoder: that one needs an owned `Frame`
/// built for every call (a Vec of frames plus a `Bytes` per argument), i.e. allocations on the
/// hot path, where this writes straight into the connection's buffer and allocates only when
/// the buffer must grow.
pub fn encode_command(buf: &mut BytesMut, parts: &[&[&[u8]]]) {
    let args = || parts.iter().flat_map(|part| part.iter());
    let argc = args().count();
    let len = 1
        + Decimal::new(argc).len()
        + 2
        + args()
            .map(|arg| 1 + Decimal::new(arg.len()).len() + 2 + arg.len() + 2)
            .sum::<usize>();
    buf.reserve(len);
    buf.put_u8(b'*');
    buf.put_slice(Decimal::new(argc).as_bytes());
    buf.put_slice(b"\r\n");
    for arg in args() {
        buf.put_u8(b'$');
        buf.put_slice(Decimal::new(arg.len()).as_bytes());
        buf.put_slice(b"\r\n");
        buf.put_slice(arg);
        buf.put_slice(b"\r\n");
    }
}

/// The decimal digits of a number, formatted on the stack.
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn new(mut n: usize) -> Decimal {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Decimal { digits, start };
            }
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }

    fn len(&self) -> usize {
        self.digits.len() - self.start
    }
}

/// The deepest nesting of arrays accepted in a reply. Ours nest at most three deep (`CLUSTER
/// SLOTS`); redis-protocol's decoder recurses once per level with no limit of its own, and
/// building and dropping a `Reply` recurse too, so a stream of `*1\r\n`s would overflow a core's
/// stack (about 800 levels in a debug build, a few thousand in release) long before any
/// length limit is reached.
const MAX_DEPTH: usize = 32;

/// The largest reply accepted, in bytes on the wire: one that declares more (in a bulk string's
/// length) or has buffered more while still incomplete is refused. Far beyond anything this
/// client reads (a binding hash, a page of 250 rows); a stream claiming more is garbled or
/// hostile, and is dropped instead of buffered.
const MAX_REPLY: usize = 64 * 1024 * 1024;

/// Takes one complete reply off the front of `buf`. `Ok(None)` means the frame is not complete
/// yet (read more and call again); `Err` means the stream is corrupt and must be dropped. The
/// inner `Err` is the server's error reply.
///
/// redis-protocol's range decoder parses the frame in place; the reply's strings are copied
/// out and the frame's bytes are then `advance`d past, so `buf` stays the only owner of its
/// allocation and the next read reuses it (splitting the frame off, as `decode_bytes_mut`
/// does, shares the buffer with the reply, and the next `reserve` then allocates a new one).
pub fn decode_reply(buf: &mut BytesMut) -> Result<Option<Result<Reply, RedisError>>, RedisError> {
    within_limits(buf)?;
    match decode_range(buf) {
        Ok(None) if buf.len() > MAX_REPLY => Err(protocol("a reply larger than the limit")),
        Ok(None) => Ok(None),
        Ok(Some((frame, len))) => {
            let reply = into_reply(buf, frame)?;
            buf.advance(len);
            Ok(Some(reply))
        }
        Err(e) => Err(RedisError::Protocol(e.to_string())),
    }
}

fn protocol(what: &str) -> RedisError {
    RedisError::Protocol(what.to_string())
}

/// Rejects a first frame that nests deeper than `MAX_DEPTH` or declares more than `MAX_REPLY`
/// bytes, as far as it is buffered, before the recursive decoder sees it. Reads only
/// the frame's headers (type bytes and lengths, skipping bulk contents by their length); their
/// syntax is the decoder's to check, so whatever this does not recognise it leaves to it.
fn within_limits(buf: &[u8]) -> Result<(), RedisError> {
    // Elements still to come in each array entered and not yet complete.
    let mut open = [0u64; MAX_DEPTH];
    let mut depth = 0;
    let mut at = 0usize;
    loop {
        let Some(rest) = buf.get(at..) else {
            return Ok(());
        };
        let Some(&kind) = rest.first() else {
            return Ok(());
        };
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(());
        };
        let len = || std::str::from_utf8(&rest[1..eol]).ok()?.parse::<i64>().ok();
        at += eol + 2;
        match kind {
            b'*' => match len() {
                Some(n) if n > 0 => {
                    if depth == MAX_DEPTH {
                        return Err(protocol("a reply nested deeper than the limit"));
                    }
                    open[depth] = n as u64;
                    depth += 1;
                    continue;
                }
                // Empty or null: a leaf.
                Some(_) => {}
                None => return Ok(()),
            },
            b'$' => match len() {
                Some(n) if n >= 0 => at = at.saturating_add((n as u64).saturating_add(2) as usize),
                // Null (or a bad length, the decoder's to reject).
                _ => {}
            },
            b'+' | b'-' | b':' => {}
            _ => return Ok(()),
        }
        if at > MAX_REPLY {
            return Err(protocol("a reply larger than the limit"));
        }
        // One leaf done: close every array it completes; the frame ends with the outermost.
        loop {
            let Some(last) = depth.checked_sub(1) else {
                return Ok(());
            };
            open[last] -= 1;
            if open[last] > 0 {
                break;
            }
            depth = last;
        }
    }
}

/// The reply `frame` (ranges into `buf`) describes, its strings copied out. An error nested in
/// an array (only MULTI/EXEC and odd script returns produce one) fails the whole reply: no
/// caller here can act on partial results.
fn into_reply(buf: &[u8], frame: RangeFrame) -> Result<Result<Reply, RedisError>, RedisError> {
    let bytes = |(start, end): (usize, usize)| {
        buf.get(start..end)
            .ok_or_else(|| protocol("a frame range outside the buffer"))
    };
    Ok(Ok(match frame {
        RangeFrame::SimpleString(range) => Reply::Simple(Blob::from(bytes(range)?)),
        RangeFrame::Error(range) => {
            let msg = String::from_utf8_lossy(bytes(range)?).into_owned();
            return Ok(Err(RedisError::Reply(msg)));
        }
        RangeFrame::Integer(n) => Reply::Int(n),
        RangeFrame::BulkString(range) => {
            // The decoder skips the two bytes after the contents without looking at them.
            if bytes((range.1, range.1 + 2))? != b"\r\n" {
                return Err(protocol("a bulk string not ended by CRLF"));
            }
            Reply::Bulk(Blob::from(bytes(range)?))
        }
        RangeFrame::Array(frames) => {
            let mut items = Vec::with_capacity(frames.len());
            for frame in frames {
                match into_reply(buf, frame)? {
                    Ok(item) => items.push(item),
                    Err(e) => return Ok(Err(e)),
                }
            }
            Reply::Array(items)
        }
        RangeFrame::Null => Reply::Nil,
    }))
}

/// Reads replies off a stream, one at a time, keeping any bytes of the next ones.
pub(crate) struct ReplyReader<R> {
    io: R,
    buf: BytesMut,
}

impl<R: AsyncReadRent> ReplyReader<R> {
    /// The next reply. The outer error is the connection failing (closed, reset, corrupt
    /// stream); after it the reader must be dropped.
    pub(crate) async fn next(&mut self) -> io::Result<Result<Reply, RedisError>> {
        loop {
            match decode_reply(&mut self.buf) {
                Ok(Some(reply)) => return Ok(reply),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            self.buf.reserve(READ_CHUNK);
            let buf = std::mem::take(&mut self.buf);
            let filled = buf.len();
            let (read, buf) = self.io.read(buf.slice_mut(filled..)).await;
            self.buf = buf.into_inner();
            if read? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// The halves of a `Transport`: a plain connection pays one enum branch per read or write for
/// being able to be TLS.
pub(crate) type ReadHalf = ReplyReader<OwnedReadHalf<Transport>>;
pub(crate) type WriteHalf = OwnedWriteHalf<Transport>;

/// A freshly opened connection used one request at a time.
pub(crate) struct Connection {
    reader: ReadHalf,
    writer: WriteHalf,
    wbuf: BytesMut,
}

impl Connection {
    /// Over a stream already connected (and through its TLS handshake, if any).
    pub(crate) fn new(stream: Transport) -> Connection {
        let (read, writer) = stream.into_split();
        Connection {
            reader: ReplyReader {
                io: read,
                buf: BytesMut::new(),
            },
            writer,
            wbuf: BytesMut::new(),
        }
    }

    pub(crate) async fn request(
        &mut self,
        args: &[&[u8]],
    ) -> io::Result<Result<Reply, RedisError>> {
        encode_command(&mut self.wbuf, &[args]);
        let (written, mut wbuf) = self.writer.write_all(std::mem::take(&mut self.wbuf)).await;
        written?;
        wbuf.clear();
        self.wbuf = wbuf;
        self.reader.next().await
    }

    /// Hands the stream over for pipelining, keeping any buffered bytes and the write buffer's
    /// allocation.
    pub(crate) fn into_parts(self) -> (ReadHalf, WriteHalf, BytesMut) {
        (self.reader, self.writer, self.wbuf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_resp_array_of_bulk_strings() {
        let mut buf = BytesMut::new();
        encode_command(&mut buf, &[&[b"SET", b"k"], &[], &[b"", b"0123456789"]]);
        assert_eq!(
            &buf[..],
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$10\r\n0123456789\r\n"
        );
    }

    #[test]
    fn encoding_reserves_exactly_what_it_writes() {
        let big = vec![b'x'; 100_000];
        let args: &[&[&[u8]]] = &[&[b"SET", b"key"], &[&big]];
        let mut exact = BytesMut::new();
        encode_command(&mut exact, args);
        // Into a buffer with exactly that much room: one reservation, no reallocation.
        let mut buf = BytesMut::with_capacity(exact.len());
        let start = buf.as_ptr();
        encode_command(&mut buf, args);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(buf, exact);
    }

    #[test]
    fn decimal() {
        for n in [0usize, 7, 10, 99, 12345, usize::MAX] {
            assert_eq!(Decimal::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let stream: &[u8] =
            b"+OK\r\n$5\r\nhello\r\n*3\r\n:1\r\n$-1\r\n*1\r\n$1\r\nx\r\n-ERR bad\r\n:42\r\n";
        let expected = [
            Ok(Reply::Simple("OK".into())),
            Ok(Reply::Bulk("hello".into())),
            Ok(Reply::Array(vec![
                Reply::Int(1),
                Reply::Nil,
                Reply::Array(vec![Reply::Bulk("x".into())]),
            ])),
            Err(RedisError::Reply("ERR bad".into())),
            Ok(Reply::Int(42)),
        ];
        // Feed the stream one byte at a time: every prefix short of a frame must decode to
        // "incomplete" and leave the buffer untouched.
        let mut buf = BytesMut::new();
        let mut replies = Vec::new();
        for &byte in stream {
            buf.put_u8(byte);
            let before = buf.len();
            match decode_reply(&mut buf).unwrap() {
                Some(reply) => replies.push(reply),
                None => assert_eq!(buf.len(), before),
            }
        }
        assert_eq!(replies, expected);
        assert!(buf.is_empty());
    }

    #[test]
    fn nested_error_fails_the_reply() {
        let mut buf = BytesMut::from(&b"*2\r\n:1\r\n-WRONGTYPE nope\r\n"[..]);
        assert_eq!(
            decode_reply(&mut buf).unwrap(),
            Some(Err(RedisError::Reply("WRONGTYPE nope".into())))
        );
    }

    fn is_protocol_error(wire: &[u8]) -> bool {
        matches!(
            decode_reply(&mut BytesMut::from(wire)),
            Err(RedisError::Protocol(_))
        )
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        for wire in [
            &b"?what\r\n"[..],
            b"$-2\r\n",
            b"*-2\r\n",
            b"$x\r\nab\r\n",
            b":12a\r\n",
            b"$99999999999999999999999\r\n",
            // A bulk string's contents run on past its length.
            b"$1\r\nxyz\r\n",
            b"*2\r\n$1\r\nxy\r\n:1\r\n",
        ] {
            assert!(
                is_protocol_error(wire),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused_before_it_is_decoded() {
        let nested = |depth: usize, leaf: &[u8]| {
            let mut wire = b"*1\r\n".repeat(depth);
            wire.extend_from_slice(leaf);
            wire
        };
        // Deep enough to overflow the stack of the decoder's recursion, even while incomplete.
        assert!(is_protocol_error(&nested(100_000, b":1\r\n")));
        assert!(is_protocol_error(&nested(100_000, b"")));
        assert!(is_protocol_error(&nested(MAX_DEPTH + 1, b":1\r\n")));
        // Nested deep but later in the frame, after a sibling whose contents look like a header.
        let mut wire = b"*2\r\n$4\r\n*1\r\n\r\n".to_vec();
        wire.extend_from_slice(&nested(MAX_DEPTH, b":1\r\n"));
        assert!(is_protocol_error(&wire));
        // At the limit it decodes; so do wide (not deep) arrays.
        let mut buf = BytesMut::from(&nested(MAX_DEPTH, b":1\r\n")[..]);
        let mut reply = decode_reply(&mut buf).unwrap().unwrap().unwrap();
        for _ in 0..MAX_DEPTH {
            let Reply::Array(mut items) = reply else {
                panic!("not an array: {reply:?}")
            };
            reply = items.pop().unwrap();
        }
        assert_eq!(reply, Reply::Int(1));
        assert!(buf.is_empty());
        let mut wide = b"*1000\r\n".to_vec();
        for _ in 0..1000 {
            wide.extend_from_slice(b"*1\r\n*0\r\n");
        }
        let mut buf = BytesMut::from(&wide[..]);
        let reply = decode_reply(&mut buf).unwrap().unwrap().unwrap();
        assert_eq!(reply.as_array().unwrap().len(), 1000);
    }

    #[test]
    fn huge_declared_lengths_are_refused_or_wait_without_allocating_them() {
        // A bulk string beyond the limit is refused from its header.
        assert!(is_protocol_error(b"$99999999999\r\n"));
        assert!(is_protocol_error(b"*2\r\n:1\r\n$67108864\r\n"));
        assert!(is_protocol_error(format!("${}\r\n", i64::MAX).as_bytes()));
        // Within it, the frame is only incomplete.
        let mut buf = BytesMut::from(&b"$1000000\r\nabc"[..]);
        assert_eq!(decode_reply(&mut buf).unwrap(), None);
        // A huge element count is incomplete too: the decoder reserves for what has arrived,
        // not for what is declared (else this test would abort on the allocation).
        for wire in [
            format!("*{}\r\n:1\r\n", i64::MAX),
            format!("*{}\r\n", u32::MAX),
        ] {
            let mut buf = BytesMut::from(wire.as_bytes());
            assert_eq!(decode_reply(&mut buf).unwrap(), None, "{wire}");
        }
    }

    #[test]
    fn an_incomplete_reply_past_the_limit_is_refused() {
        let mut buf = BytesMut::from(&b"*3\r\n"[..]);
        buf.put_slice(format!("${}\r\n", MAX_REPLY - 100).as_bytes());
        buf.resize(buf.len() + MAX_REPLY - 100, b'x');
        buf.put_slice(b"\r\n");
        // Complete so far (one element of three); the buffer is over the limit.
        assert!(decode_reply(&mut buf.clone()).unwrap().is_none());
        buf.resize(MAX_REPLY + 1, b':');
        assert!(matches!(
            decode_reply(&mut buf),
            Err(RedisError::Protocol(_))
        ));
    }

    #[test]
    fn a_steady_answer_stays_inline_and_a_long_string_spills() {
        let steady = "2f653d38f176fc04f85723969d095966 1796327102393 0";
        let mut buf = BytesMut::from(format!("${}\r\n{steady}\r\n", steady.len()).as_bytes());
        let Reply::Bulk(short) = decode_reply(&mut buf).unwrap().unwrap().unwrap() else {
            panic!("not a bulk string");
        };
        assert_eq!((&short[..], short.spilled()), (steady.as_bytes(), false));
        let long = "x".repeat(Blob::INLINE + 1);
        let mut buf = BytesMut::from(format!("+{long}\r\n").as_bytes());
        let Reply::Simple(spilled) = decode_reply(&mut buf).unwrap().unwrap().unwrap() else {
            panic!("not a simple string");
        };
        assert_eq!((&spilled[..], spilled.spilled()), (long.as_bytes(), true));
    }

    #[test]
    fn a_decoded_reply_does_not_share_the_read_buffer() {
        let mut buf = BytesMut::with_capacity(64);
        let start = buf.as_ptr();
        buf.put_slice(b"$5\r\nhello\r\n+OK\r\n");
        let hello = decode_reply(&mut buf).unwrap().unwrap().unwrap();
        let ok = decode_reply(&mut buf).unwrap().unwrap().unwrap();
        assert!(buf.is_empty());
        // With both replies still alive, the next read's room is the same allocation again.
        buf.reserve(64);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(
            (hello, ok),
            (Reply::Bulk("hello".into()), Reply::Simple("OK".into()))
        );
    }
}
