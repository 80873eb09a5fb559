//! RESP2 framing over one TCP stream: command encoding, reply decoding, and a plain
//! request/response `Connection` used for handshakes and cluster discovery before a stream is
//! handed to the pipelined `Node`.

use std::io;

use bytes::{BufMut, BytesMut};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;

use super::{Endpoint, RedisError, Reply};

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

/// Takes one complete reply off the front of `buf`. `Ok(None)` means the frame is not complete
/// yet (read more and call again); `Err` means the stream is corrupt and must be dropped. The
/// inner `Err` is the server's error reply.
pub(crate) fn decode_reply(
    buf: &mut BytesMut,
) -> Result<Option<Result<Reply, RedisError>>, RedisError> {
    match decode_bytes_mut(buf) {
        Ok(None) => Ok(None),
        Ok(Some((frame, _, _))) => Ok(Some(into_reply(frame))),
        Err(e) => Err(RedisError::Protocol(e.to_string())),
    }
}

/// An error nested in an array (only MULTI/EXEC and odd script returns produce one) fails the
/// whole reply: no caller here can act on partial results.
fn into_reply(frame: BytesFrame) -> Result<Reply, RedisError> {
    Ok(match frame {
        BytesFrame::SimpleString(s) => Reply::Simple(s),
        BytesFrame::Error(msg) => return Err(RedisError::Reply(msg.to_string())),
        BytesFrame::Integer(n) => Reply::Int(n),
        BytesFrame::BulkString(b) => Reply::Bulk(b),
        BytesFrame::Array(items) => Reply::Array(
            items
                .into_iter()
                .map(into_reply)
                .collect::<Result<_, _>>()?,
        ),
        BytesFrame::Null => Reply::Nil,
    })
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

pub(crate) type ReadHalf = ReplyReader<OwnedReadHalf<TcpStream>>;
pub(crate) type WriteHalf = OwnedWriteHalf<TcpStream>;

/// A freshly opened connection used one request at a time.
pub(crate) struct Connection {
    reader: ReadHalf,
    writer: WriteHalf,
    wbuf: BytesMut,
}

impl Connection {
    pub(crate) async fn open(endpoint: &Endpoint) -> io::Result<Connection> {
        let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        // Replies to pipelined requests are latency-bound; never let Nagle hold a write back.
        stream.set_nodelay(true)?;
        let (read, writer) = stream.into_split();
        Ok(Connection {
            reader: ReplyReader {
                io: read,
                buf: BytesMut::new(),
            },
            writer,
            wbuf: BytesMut::new(),
        })
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

    #[test]
    fn garbage_is_a_protocol_error() {
        let mut buf = BytesMut::from(&b"?what\r\n"[..]);
        assert!(matches!(
            decode_reply(&mut buf),
            Err(RedisError::Protocol(_))
        ));
    }
}
