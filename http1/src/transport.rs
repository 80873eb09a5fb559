//! One connection's byte stream, plain TCP or TLS over it, as every reader and writer of this
//! crate (and the node's Redis client) sees it.
//!
//! An enum rather than a type parameter: the server loop, a request, the pool and the tunnel
//! stay one monomorphization each, and a plain connection pays one branch per read or write,
//! as a C proxy's function pointer would. The TLS state (rustls' connection and its record
//! buffers, a few KiB) is boxed so a plain connection does not carry its size.

use std::io;

use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, Split};
use monoio::net::TcpStream;

pub enum Transport {
    Plain(TcpStream),
    /// Accepted by a TLS listener.
    TlsServer(Box<monoio_rustls::ServerTlsStream<TcpStream>>),
    /// Connected to a TLS server.
    TlsClient(Box<monoio_rustls::ClientTlsStream<TcpStream>>),
}

/// The same call on whichever stream a transport holds.
macro_rules! each {
    ($transport:expr, $s:ident => $call:expr) => {
        match $transport {
            Transport::Plain($s) => $call,
            Transport::TlsServer($s) => $call,
            Transport::TlsClient($s) => $call,
        }
    };
}

// SAFETY: both variants may be read and written at once from two halves on one thread:
// `TcpStream` is `Split`, and monoio-rustls declares its stream `Split` over a `Split` IO (its
// reads and writes touch separate record buffers; rustls' state changes between awaits only).
unsafe impl Split for Transport {}

impl Transport {
    pub fn is_tls(&self) -> bool {
        !matches!(self, Transport::Plain(_))
    }
}

impl From<TcpStream> for Transport {
    fn from(stream: TcpStream) -> Transport {
        Transport::Plain(stream)
    }
}

impl AsyncReadRent for Transport {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        each!(self, s => s.read(buf).await)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        each!(self, s => s.readv(buf).await)
    }
}

impl AsyncWriteRent for Transport {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        each!(self, s => s.write(buf).await)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        each!(self, s => s.writev(buf).await)
    }

    async fn flush(&mut self) -> io::Result<()> {
        each!(self, s => s.flush().await)
    }

    /// Over TLS, a `close_notify` first, then the TCP write side.
    async fn shutdown(&mut self) -> io::Result<()> {
        each!(self, s => s.shutdown().await)
    }
}
