//! One connection's byte stream, plain TCP or TLS over it, as every reader and writer of this
//! crate (and the node's Redis client) sees it.
//!
//! An enum rather than a type parameter: the server loop, a request, the pool and the tunnel
//! stay one monomorphization each, and a plain connection pays one branch per read or write,
//! as a C proxy's function pointer would. The TLS state (rustls' connection and its record
//! buffers, a few KiB) is boxed so a plain connection does not carry its size.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, Split};
use monoio::net::TcpStream;

pub enum Transport {
    Plain(TcpStream),
    /// Accepted by a TLS listener.
    TlsServer(Box<monoio_rustls::ServerTlsStream<TcpStream>>),
    /// Connected to a TLS server; the descriptor of the TCP stream under it, which the TLS
    /// stream does not lend out, for [`Transport::is_stale`].
    TlsClient(Box<monoio_rustls::ClientTlsStream<TcpStream>>, RawFd),
}

/// The same call on whichever stream a transport holds.
macro_rules! each {
    ($transport:expr, $s:ident => $call:expr) => {
        match $transport {
            Transport::Plain($s) => $call,
            Transport::TlsServer($s) => $call,
            Transport::TlsClient($s, _) => $call,
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

    /// Whether the client chose HTTP/2 in the TLS handshake (ALPN `h2`, offered only when
    /// `http.h2` is on).
    pub fn alpn_is_h2(&self) -> bool {
        match self {
            Transport::TlsServer(s) => s.alpn_protocol().as_deref() == Some(b"h2"),
            _ => false,
        }
    }

    /// Whether an idle connection can no longer carry a request: its peer closed it (an end of
    /// stream, or a reset) or sent bytes nobody asked for (an HTTP/1.1 server's answer to
    /// nothing, a TLS `close_notify`). Checked before a pooled connection is reused, as Pingora
    /// and Go's transport do: a keep-alive connection the worker timed out is found closed here
    /// instead of by a request sent into it. One non-blocking `recv(MSG_PEEK)`, nothing
    /// consumed: a socket with nothing to read is alive.
    pub fn is_stale(&self) -> bool {
        let fd = match self {
            Transport::Plain(s) => s.as_raw_fd(),
            // A client's connection is never pooled: nothing reuses it after a pause.
            Transport::TlsServer(_) => return true,
            Transport::TlsClient(_, fd) => *fd,
        };
        peek_says_stale(fd)
    }
}

fn peek_says_stale(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `fd` is a socket this transport owns and keeps open for the call; the buffer is
    // one byte we own. MSG_DONTWAIT makes the call return at once whatever the socket's mode
    // (io_uring leaves sockets blocking); MSG_PEEK leaves any byte where it is.
    let n = unsafe {
        libc::recv(
            fd,
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        );
    }
    true
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
