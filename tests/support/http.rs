//! A deliberately small blocking HTTP/1.1 client for tests: it sends exactly the bytes a test
//! writes (malformed ones included) and parses exactly one response at a time, so keep-alive,
//! pipelining and framing can be asserted byte for byte.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
    }
}

/// What a client reads and writes through: the socket itself, or TLS over it.
pub trait Io: Read + Write {}

impl<T: Read + Write> Io for T {}

pub struct Client {
    /// The socket: its timeouts, half-close and clones.
    stream: TcpStream,
    /// Where the bytes go: a second handle of `stream`, or a TLS session over it.
    io: Box<dyn Io>,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect to node");
        let io = Box::new(stream.try_clone().expect("clone the client socket"));
        Client::over(stream, io)
    }

    /// A client whose bytes go through `io`, a session over `stream` (TLS, say).
    pub fn over(stream: TcpStream, io: Box<dyn Io>) -> Client {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            io,
            buf: Vec::new(),
        }
    }

    /// The connection's socket again, to write on from another thread while this one reads.
    pub fn writer(&self) -> TcpStream {
        self.stream.try_clone().expect("clone the client socket")
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.io.write_all(raw).expect("write request");
        self.io.flush().expect("write request");
    }

    /// Reads one response. `head_request`: the request was HEAD, so no body follows.
    pub fn read(&mut self, head_request: bool) -> Reply {
        let head_len = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            assert!(
                self.fill() > 0,
                "connection closed before a response head: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        parsed
            .parse(&self.buf[..head_len])
            .expect("parse response head");
        let status = parsed.code.unwrap();
        let headers: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        self.buf.drain(..head_len);
        let reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        let no_body = head_request || status < 200 || status == 204 || status == 304;
        let body = if no_body {
            Vec::new()
        } else if let Some(len) = reply.header("content-length") {
            let len: usize = len.parse().unwrap();
            while self.buf.len() < len {
                assert!(self.fill() > 0, "connection closed mid-body");
            }
            self.buf.drain(..len).collect()
        } else if reply.header("transfer-encoding").is_some() {
            self.read_chunked()
        } else {
            while self.fill() > 0 {}
            std::mem::take(&mut self.buf)
        };
        Reply { body, ..reply }
    }

    pub fn request(&mut self, raw: &[u8]) -> Reply {
        self.send(raw);
        self.read(raw.starts_with(b"HEAD "))
    }

    /// True once the server has closed the connection (reads EOF with nothing pending).
    pub fn is_closed(&mut self) -> bool {
        self.buf.is_empty() && matches!(self.io.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    /// Reads exactly `n` raw bytes (after a `101`, say): what is buffered first, then the
    /// socket. Panics when the connection ends or nothing arrives within the read timeout.
    pub fn read_raw(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(
                self.fill() > 0,
                "closed or timed out after {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
        self.buf.drain(..n).collect()
    }

    /// Everything until the server closes the connection: `Some(bytes)` once an end of stream
    /// arrives within `limit`, `None` when the connection is still open then.
    pub fn read_until_eof(&mut self, limit: Duration) -> Option<Vec<u8>> {
        self.stream.set_read_timeout(Some(limit)).unwrap();
        let mut chunk = [0u8; 16384];
        let result = loop {
            match self.io.read(&mut chunk) {
                Ok(0) => break Some(std::mem::take(&mut self.buf)),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if is_timeout(&e) => break None,
                // A reset is no clean end: what was sent before it may be lost.
                Err(e) => panic!("connection failed instead of closing: {e}"),
            }
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        result
    }

    /// Sends an end of stream while still reading (a TCP half-close).
    pub fn shutdown_write(&mut self) {
        self.stream.shutdown(std::net::Shutdown::Write).unwrap();
    }

    /// Reads what the socket has; 0 at an end of stream, a timeout, or an error. The callers'
    /// messages say "closed", so an error other than a timeout is printed: a reset or an
    /// `EINTR` (which a worker's io_uring probe once caused here, see pinned's
    /// `runtime::uring_available`) is then told apart from a clean close.
    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16384];
        match self.io.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n
            }
            Err(e) => {
                if !is_timeout(&e) {
                    eprintln!("test http client: read failed: {e} ({:?})", e.kind());
                }
                0
            }
        }
    }

    fn read_chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                assert!(self.fill() > 0, "closed in chunk size");
            };
            let size = usize::from_str_radix(
                std::str::from_utf8(&self.buf[..line_end]).unwrap().trim(),
                16,
            )
            .unwrap();
            self.buf.drain(..line_end + 2);
            while self.buf.len() < size + 2 {
                assert!(self.fill() > 0, "closed in chunk");
            }
            body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
            if size == 0 {
                return body;
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One request on a fresh connection.
pub fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    Client::connect(addr)
        .request(format!("GET {path} HTTP/1.1\r\nHost: t\r\n{auth}\r\n").as_bytes())
}

pub fn post_json(addr: SocketAddr, path: &str, token: Option<&str>, body: &str) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    Client::connect(addr).request(
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

/// A connection to `addr` from `source`, a local address of the test's choosing (any of
/// 127.0.0.0/8 on Linux): a second client address on one host.
pub fn tcp_from(source: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect(&addr.into())?;
    Ok(socket.into())
}

/// A client connection with a receive buffer as small as the kernel allows, so that a client
/// that does not read stops taking bytes at once.
pub fn tight_client(addr: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap();
    let stream: TcpStream = socket.into();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream
}

/// Whether a read failed only because its timeout ran out (a socket with a read timeout says
/// `WouldBlock` or `TimedOut`, by platform).
pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
