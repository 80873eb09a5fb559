//! A client connection's two halves and its queued output, and the two I/O steps every
//! connection of ours is made of: one read appended to a buffer ([`read_into`]) and a write
//! bounded by a stall timeout ([`write_all_within`]). Below both the server loop
//! ([`crate::server`]) and a request's body ([`crate::request`]), which each use it.

use std::time::Duration;

use bytes::BytesMut;
use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf};
use monoio_codec::FramedRead;

use super::head::HeadDecoder;
use super::transport::Transport;

const READ_CHUNK: usize = 16 * 1024;

/// A served client connection: its read half framed by the head decoder, its write half and the
/// answers not yet written.
pub struct Conn {
    pub(super) reader: FramedRead<OwnedReadHalf<Transport>, HeadDecoder>,
    pub(super) writer: OwnedWriteHalf<Transport>,
    /// Responses not yet written: flushed when the client has no further request pipelined,
    /// or once they pass [`crate::server::OUTPUT_HIGH_WATER`].
    pub(super) out: BytesMut,
    /// Bytes written to the client so far (what `out` held at each flush).
    pub(super) sent: u64,
    pub(super) write_timeout: Duration,
    /// Whether the connection is TLS (the scheme a forward states as `X-Forwarded-Proto`).
    pub(super) secure: bool,
}

/// Appends one read's worth of bytes to `buf`; `Ok(0)` at end of stream.
pub async fn read_into<R: AsyncReadRent>(io: &mut R, buf: &mut BytesMut) -> std::io::Result<usize> {
    buf.reserve(READ_CHUNK);
    let (len, cap) = (buf.len(), buf.capacity());
    let owned = std::mem::take(buf);
    let (result, slice) = io.read(owned.slice_mut(len..cap)).await;
    *buf = slice.into_inner();
    result
}

impl Conn {
    /// Writes out everything queued in `out`. False when the client is gone, or took no byte
    /// for the write timeout (the connection must close then).
    pub(super) async fn flush(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let out = std::mem::take(&mut self.out);
        self.sent += out.len() as u64;
        match write_all_within(&mut self.writer, out, self.write_timeout).await {
            Some(mut out) => {
                out.clear();
                self.out = out;
                true
            }
            None => false,
        }
    }
}

/// Writes all of `buf`, giving up when one write moves no byte for `idle`: a peer that stops
/// reading is cut off after `idle`, however slowly a large answer is legitimately taken. The
/// buffer comes back on success (for reuse); on failure it is gone with the connection.
pub async fn write_all_within<W: AsyncWriteRent, B: IoBuf>(
    io: &mut W,
    buf: B,
    idle: Duration,
) -> Option<B> {
    let mut buf = buf;
    let mut written = 0;
    while written < buf.bytes_init() {
        let (result, slice) = monoio::time::timeout(idle, io.write(buf.slice(written..)))
            .await
            .ok()?;
        buf = slice.into_inner();
        match result {
            Ok(0) | Err(_) => return None,
            Ok(n) => written += n,
        }
    }
    Some(buf)
}
